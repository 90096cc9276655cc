"""`POST /v1/command`, `POST /v1/query` and `/v1/kv` on a member running a user's machine,
over HTTP on a real member: answers that are not JSON, queries the machine refuses or fails
on, a body too large, `/v1/kv` refused naming the machine; and the start-up refusals of a spec
that cannot load (exit 2, one line) and of a data dir of another kind of machine (exit 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.kvclient import KVClient
from tests.harness.polling import wait_for
from tests.node.one_member import one_member, run_to_exit, serving

ROOT = Path(__file__).resolve().parents[2]
AWKWARD = "tests.statemachine.awkward:Awkward"
ENV = {"PYTHONPATH": str(ROOT)}


def post(c: KVClient, path: str, body: bytes):
    return c.request("POST", path, body=body)


def ready(c: KVClient) -> None:
    wait_for(lambda: c.request("GET", "/readyz").status == 200, 20, "the member to lead")


def test_command_and_query_answers_over_http(tmp_path):
    node = one_member(tmp_path / "d", "--state-machine", AWKWARD, "--max-value-bytes", "100",
                      env=ENV)
    with serving(node), node.client() as c:
        ready(c)
        ok = post(c, "/v1/command", b"one")
        assert ok.status == 200 and ok.json() == {"count": 1}
        index = int(ok.headers["flotilla-index"])  # the command's own log index
        assert index >= 2  # after the leader's no-op
        local = post(c, "/v1/query?consistency=serializable", b"null")
        assert int(local.headers["flotilla-index"]) >= index
        raw = post(c, "/v1/command", b"bytes")
        assert raw.status == 500 and raw.json()["code"] == "not_json"
        # applied, all the same, at a later index (the leader's own configuration entry that
        # publishes its client URL may come between the two, when its no-op applied late)
        assert int(raw.headers["flotilla-index"]) in (index + 1, index + 2)
        assert "the command was applied" in raw.json()["error"]
        assert AWKWARD in raw.json()["error"]
        big = post(c, "/v1/command", b"x" * 101)
        assert big.status == 413 and big.json()["code"] == "too_large"
        answer = post(c, "/v1/query", b"null")
        assert answer.status == 200 and answer.json() == 2  # "bytes" was applied too
        assert int(answer.headers["flotilla-index"]) >= 3
        for request, status, code in ((b'"set"', 500, "not_json"), (b'"nan"', 500, "not_json"),
                                      (b'"crash"', 500, "query_failed"),
                                      (b"[1]", 400, "bad_query"), (b"{", 400, "bad_request"),
                                      (b"", 400, "bad_request")):
            refused = post(c, "/v1/query", request)
            assert (refused.status, refused.json()["code"]) == (status, code), refused.body
        kv = c.request("GET", "/v1/kv/a")
        assert kv.status == 409 and kv.json()["code"] == "not_kv"
        assert "/v1/command" in kv.json()["error"] and AWKWARD in kv.json()["error"]
        assert c.request("PUT", "/v1/kv/a", body=b"v").status == 409
        assert post(c, "/v1/command", b"after").json() == {"count": 3}


def test_the_key_value_machine_takes_commands_too(tmp_path):
    from flotilla.node.statemachine.kv import encode_put

    node = one_member(tmp_path / "d")
    with serving(node), node.client() as c:
        ready(c)
        done = post(c, "/v1/command", encode_put("k", b"v", ts=1))
        assert done.status == 200 and set(done.json()) == {"index", "mod_index"}
        assert c.request("GET", "/v1/kv/k").body == b"v"


@pytest.mark.parametrize(("spec", "says"), [
    ("nosuch.module:X", "cannot import module 'nosuch.module'"),
    ("tests.statemachine.awkward:Nope", "has no attribute 'Nope'"),
    ("tests.statemachine.awkward:Broken", "could not be constructed without arguments: "
                                          "RuntimeError: no config second line"),
    ("no-colon", "is not of the form 'module:Class'"),
])
def test_a_spec_that_cannot_load_exits_2_with_one_line(tmp_path, spec, says):
    import subprocess

    from tests.harness.processes import _node_env

    node = one_member(tmp_path / "d", "--state-machine", spec, start=False)
    done = subprocess.run(node.argv, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, env=_node_env(ENV))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flotilla node: --state-machine: "), lines
    assert says in lines[0]
    assert not (tmp_path / "d").exists()


def test_a_data_dir_of_another_machine_is_refused(tmp_path):
    data = tmp_path / "d"
    node = one_member(data, "--state-machine", "flotilla.examples.counter:Counter")
    with serving(node), node.client() as c:
        ready(c)
        assert post(c, "/v1/command", b"5").json() == {"total": 5}
    assert json.loads((data / "state-machine.json").read_text()) == {"kind": "counter"}
    done = run_to_exit(one_member(data, start=False))
    assert done.returncode == 3, done.stderr
    assert "holds the state of a 'counter' state machine, but this member runs kv" in done.stderr
    node.restart()  # nothing changed: the Counter member serves its total again
    with serving(node), node.client() as c:
        ready(c)
        assert post(c, "/v1/query", b"null").json() == 5
