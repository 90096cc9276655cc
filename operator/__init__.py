"""The Flotilla operator: RaftCluster objects reconciled into StatefulSets and membership.

Decisions live in `planner` (pure: observed state in, the next single action out), so the
Kubernetes adapter and the local adapter (`flotilla scale`) share them. Nothing here imports
kopf or kubernetes at package import: `flotilla scale` must not need them.

This folder is installed as `flotilla.operator`. Run from the repository root, Python puts the
checkout first on sys.path, and `import operator` would find this folder instead of the
standard library's module (`python -m venv .venv` from a fresh clone broke on exactly that).
So when this file is imported under the top-level name, it hands over to the standard library.
"""

if __name__ == "operator":
    # Only what is loaded before any import: importlib.util would import collections, which
    # imports operator, which is this file.
    import os as _os
    import sys as _sys

    _path = _os.path.join(getattr(_sys, "_stdlib_dir", None)
                          or _os.path.dirname(_os.__file__), "operator.py")
    _stdlib = type(_sys)("operator")
    _stdlib.__file__ = _path
    _sys.modules["operator"] = _stdlib
    with open(_path, encoding="utf-8") as _source:
        exec(compile(_source.read(), _path, "exec"), vars(_stdlib))
    globals().update({k: v for k, v in vars(_stdlib).items() if not k.startswith("__")})
