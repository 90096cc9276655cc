"""Flotilla: Raft replicated-state-machine clusters on Kubernetes.

The parts live in top-level folders of the repository and are installed as sub-packages:
``flotilla.node`` (``node/``), ``flotilla.operator`` (``operator/``) and ``flotilla.pipeline``
(``pipeline/``).
"""

__version__ = "0.1.0"
