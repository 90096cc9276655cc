"""Loading a user's state machine from a `module:Class` spec, with errors that say what to fix."""

from __future__ import annotations

import textwrap

import pytest
from flotilla.node.statemachine import KVStateMachine, StateMachineLoadError, load_state_machine

USER_MODULE = """
import msgpack

class Counter:
    kind = "counter"
    def __init__(self):
        self.total = 0
    def apply(self, index, command):
        self.total += int(command)
        return self.total
    def write_snapshot(self, stream):
        stream.write(msgpack.packb(self.total))
    def restore(self, stream):
        self.total = msgpack.unpackb(stream.read())
    def query(self, request):
        return self.total

class Outer:
    Inner = Counter

def make():
    return Counter()

NOT_CALLABLE = 42

class NeedsArgs:
    def __init__(self, path):
        pass

class Incomplete:
    kind = "half"
    def apply(self, index, command):
        return None

class NoKind(Counter):
    kind = ""
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "flotilla_user_sm.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "flotilla_user_sm"


@pytest.mark.parametrize("attr", ["Counter", "Outer.Inner", "make"])
def test_a_class_or_factory_is_loaded_and_instantiated(user_module, attr):
    machine = load_state_machine(f"{user_module}:{attr}")
    assert machine.kind == "counter"
    assert machine.apply(1, b"3") == 3


def test_kv_names_the_built_in_machine():
    assert isinstance(load_state_machine("kv"), KVStateMachine)
    assert isinstance(
        load_state_machine("flotilla.node.statemachine.kv:KVStateMachine"), KVStateMachine
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("flotilla_user_sm", "not of the form 'module:Class'"),
        ("flotilla_user_sm:", "not of the form"),
        (":Counter", "not of the form"),
        ("a:b:c", "not of the form"),
        ("no_such_module_xyz:Thing", "cannot import module 'no_such_module_xyz'"),
        ("flotilla_user_sm:Missing", "has no attribute 'Missing'"),
        ("flotilla_user_sm:Outer.Missing", "has no attribute 'Outer.Missing'"),
        ("flotilla_user_sm:NOT_CALLABLE", "names a int"),
        ("flotilla_user_sm:NeedsArgs", "could not be constructed without arguments"),
        ("flotilla_user_sm:Incomplete", "missing write_snapshot, restore, query"),
        ("flotilla_user_sm:NoKind", "`kind` must be a non-empty str"),
    ],
)
def test_a_bad_spec_is_explained(user_module, spec, message):
    with pytest.raises(StateMachineLoadError) as caught:
        load_state_machine(spec)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)  # the CLI turns it into exit code 2
