"""Example state machines that ship with Flotilla, loadable by spec without any PYTHONPATH
(`flotilla node --state-machine flotilla.examples.counter:Counter`); docs/state-machines.md
walks through them."""
