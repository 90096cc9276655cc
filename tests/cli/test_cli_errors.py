"""Every way a user can hold `flotilla` wrong ends in one line on stderr and the documented exit
code (2 bad usage, 1 the command failed), never a traceback. No member process is needed: a
cluster that never started, a stub member, or nothing at all stands in."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from flotilla.cli import known_leader
from flotilla.local import LocalCluster
from tests.cli.conftest import ok, text
from tests.harness.cli import flotilla
from tests.harness.stub_server import StubNode

#: Every command that takes --timeout, with what it needs besides.
TIMED = [
    ["up"], ["status"], ["down"], ["scale", "3"],
    ["kv", "put", "k", "v"], ["kv", "get", "k"], ["kv", "del", "k"], ["kv", "ls"],
    ["member", "list"], ["member", "add", "n9", "--peer-url", "http://127.0.0.1:1",
                         "--client-url", "http://127.0.0.1:2"],
    ["member", "remove", "n9"], ["leader", "move", "n1"], ["snapshot"],
]


def one_line_error(result, code: int) -> str:
    """The one stderr line of a failed command, after checking how it failed."""
    err = result.stderr.decode(errors="replace")
    assert result.returncode == code, text(result)
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert result.stdout == b"", text(result)
    return err


@pytest.fixture(scope="module")
def a_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("files") / "regular-file"
    path.write_text("not a directory\n")
    return path


def bad_usage() -> list:
    cases = [
        pytest.param(["kv", "get", ""], {}, id="kv get empty key"),
        pytest.param(["kv", "put", "", "v"], {}, id="kv put empty key"),
        pytest.param(["kv", "del", ""], {}, id="kv del empty key"),
        pytest.param(["up", "--replicas", "100"], {}, id="up 100 replicas"),
        pytest.param(["up", "--replicas", "0"], {}, id="up 0 replicas"),
        pytest.param(["up", "--replicas", "11", "--base-port", "20000"], {},
                     id="up 11 replicas on fixed ports"),
        pytest.param(["up", "--base-port", "65530"], {}, id="up base port too high"),
        pytest.param(["scale", "100"], {}, id="scale to 100"),
        pytest.param(["up", "--dir", "{file}"], {}, id="up dir is a file"),
        pytest.param(["up", "--dir", "{file}/sub"], {}, id="up dir under a file"),
        pytest.param(["status", "--dir", "{file}"], {}, id="status dir is a file"),
        pytest.param(["kv", "get", "k"], {"FLOTILLA_DIR": "{file}"}, id="FLOTILLA_DIR a file"),
        pytest.param(["kv", "get", "k", "--dir", "d", "--endpoints", "http://127.0.0.1:1"], {},
                     id="dir and endpoints"),
        pytest.param(["kv", "get", "k", "--endpoints", "nonsense"], {}, id="bad endpoints"),
        pytest.param(["kv", "get", "k"], {"FLOTILLA_ENDPOINTS": "ftp://x"},
                     id="bad FLOTILLA_ENDPOINTS"),
        pytest.param(["status", "-o", "xml"], {}, id="status -o xml"),
        pytest.param(["kv", "ls", "-o", "csv"], {}, id="kv ls -o csv"),
        pytest.param(["member", "add", "n9", "--peer-url", "nope", "--client-url",
                      "http://127.0.0.1:2"], {}, id="member add bad URL"),
        pytest.param(["member", "add", "n9"], {}, id="member add without URLs"),
        pytest.param(["member", "remove", ""], {}, id="member remove empty name"),
        pytest.param(["leader", "move"], {}, id="leader move without a name"),
        pytest.param(["kv", "get", "k", "--token", ""], {}, id="empty token"),
        pytest.param(["completion", "fish"], {}, id="completion fish"),
        pytest.param(["no-such-command"], {}, id="unknown command"),
        pytest.param(["kv"], {}, id="kv without an operation"),
        pytest.param(["member"], {}, id="member without an operation"),
        pytest.param(["operator", "--interval", "nan"], {}, id="operator --interval nan"),
        pytest.param(["operator"], {"FLOTILLA_OPERATOR_INTERVAL": "x"},
                     id="bad FLOTILLA_OPERATOR_INTERVAL"),
        pytest.param(["operator", "--no-such-flag"], {}, id="operator unknown flag"),
        pytest.param(["operator", "--log-format", "xml"], {}, id="operator --log-format xml"),
        pytest.param(["operator"], {"FLOTILLA_LOG_LEVEL": "loud"}, id="bad FLOTILLA_LOG_LEVEL"),
        pytest.param(["operator", "--metrics-port", "70000"], {},
                     id="operator --metrics-port 70000"),
    ]
    for command in TIMED:
        for value in ("0", "-1", "nan", "inf"):
            cases.append(pytest.param([*command, "--timeout", value], {},
                                      id=f"{' '.join(command[:2])} --timeout {value}"))
    cases.append(pytest.param(["scale", "3", "--catch-up-timeout", "nan"], {},
                              id="scale --catch-up-timeout nan"))
    return cases


@pytest.mark.parametrize(("args", "env"), bad_usage())
def test_bad_usage_is_one_line_and_exit_2(args, env, a_file, tmp_path):
    fill = {"file": str(a_file)}
    result = flotilla(*(a.format(**fill) for a in args),
                      env={k: v.format(**fill) for k, v in env.items()}, cwd=tmp_path)
    err = one_line_error(result, 2)
    assert err.startswith("flotilla") and "--help" in err


def test_a_stopped_cluster_is_reported_at_once_with_what_to_do(tmp_path):
    root = tmp_path / "stopped"
    LocalCluster.create(root, 3)  # recorded, never started: nothing listens at its ports
    for args in (["kv", "get", "k"], ["kv", "put", "k", "v"], ["member", "list"],
                 ["status", "-o", "json"]):
        began = time.monotonic()
        err = one_line_error(flotilla(*args, "--dir", str(root), "--timeout", "30"), 1)
        assert time.monotonic() - began < 10, "it waited for the timeout"
        assert "nothing answers at" in err and f"flotilla up --dir {root}" in err
    endpoints = ",".join(LocalCluster.load(root).endpoints)
    err = one_line_error(flotilla("kv", "get", "k", "--endpoints", endpoints), 1)
    assert "nothing answers at" in err and "flotilla up" not in err


def test_the_operator_without_any_kubernetes_says_what_to_do(tmp_path):
    result = flotilla("operator", env={"KUBECONFIG": str(tmp_path / "none"),
                                       "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""})
    err = one_line_error(result, 1)
    assert "KUBECONFIG" in err and "inside a cluster" in err


def test_the_operator_with_its_metrics_port_taken_says_so_and_exits_2(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"  # loadable; nothing is asked of it before the port
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = flotilla("operator", "--metrics-port", str(port),
                          env={"KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""})
    err = one_line_error(result, 2)
    assert f"cannot listen on port {port} (--metrics-port)" in err


def test_version():
    assert ok(flotilla("--version")) == "flotilla 0.1.0\n"


# --- the admin token, against a stub member ---------------------------------------------------


@pytest.fixture
def stub():
    with StubNode() as node:
        yield node


def sent_tokens(stub: StubNode) -> set[str | None]:
    """The Authorization headers of the calls (leader discovery's GET /v1/status aside)."""
    return {h.get("authorization") for _, target, h, _ in stub.requests
            if target != "/v1/status"}


def test_the_token_comes_from_the_flag_then_the_environment(stub):
    add = ["member", "add", "n9", "--peer-url", "http://127.0.0.1:1", "--client-url",
           "http://127.0.0.1:2", "--endpoints", stub.url]
    ok(flotilla(*add, env={"FLOTILLA_TOKEN": "from-env"}))
    assert sent_tokens(stub) == {"Bearer from-env"}
    stub.requests.clear()
    ok(flotilla(*add, "--token", "from-flag", env={"FLOTILLA_TOKEN": "from-env"}))
    assert sent_tokens(stub) == {"Bearer from-flag"}
    assert [m["name"] for m in stub.members] == ["n9", "n9"]


def test_the_token_up_keeps_under_dir_is_sent_and_endpoints_come_from_env(stub, tmp_path):
    root = tmp_path / "c"
    cluster = LocalCluster.create(root, 1)
    cluster.members[0].client_port = int(stub.url.rsplit(":", 1)[1])
    cluster.save()
    (root / "admin-token").write_text("from-dir\n")
    ok(flotilla("kv", "ls", "--dir", str(root)))
    assert sent_tokens(stub) == {"Bearer from-dir"}
    stub.requests.clear()
    # FLOTILLA_DIR finds it too; a --dir flag beats FLOTILLA_ENDPOINTS.
    ok(flotilla("kv", "ls", env={"FLOTILLA_DIR": str(root)}))
    ok(flotilla("kv", "ls", "--dir", str(root),
                env={"FLOTILLA_ENDPOINTS": "http://127.0.0.1:1"}))
    assert sent_tokens(stub) == {"Bearer from-dir"}
    stub.requests.clear()
    ok(flotilla("kv", "ls", env={"FLOTILLA_ENDPOINTS": stub.url}))
    assert sent_tokens(stub) == {None}


def test_a_refused_token_is_one_line_naming_the_flag(stub):
    stub.canned = [(401, json.dumps({"error": "the request carries a wrong token",
                                     "code": "unauthorized"}).encode())] * 5
    err = one_line_error(flotilla("member", "remove", "n9", "--endpoints", stub.url,
                                  "--token", "wrong"), 1)
    assert "wrong token" in err and "--token or FLOTILLA_TOKEN" in err


# --- who leads, as `flotilla status` tells it -----------------------------------------------


def test_status_names_only_a_leader_that_answered_and_says_so():
    follower = {"role": "follower", "term": 3, "leader": "n1"}
    # n1 died: the followers still name it, but it is not the leader status reports.
    assert known_leader({"n1": None, "n2": follower, "n3": follower}) is None
    assert known_leader({"n1": {"role": "leader", "term": 3, "leader": "n1"},
                         "n2": follower, "n3": None}) == "n1"
    # An old leader cut off from the rest still says it leads, in an older term.
    assert known_leader({"n1": {"role": "leader", "term": 3},
                         "n2": {"role": "leader", "term": 4},
                         "n3": {"role": "follower", "term": 4, "leader": "n2"}}) == "n2"
    assert known_leader({}) is None


def test_something_else_answering_at_the_endpoint_is_one_line(stub):
    stub.canned = [(200, b"<html>not a member</html>")] * 20
    err = one_line_error(flotilla("kv", "ls", "--endpoints", stub.url, "--timeout", "2"), 1)
    assert "not JSON" in err
