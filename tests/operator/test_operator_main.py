"""`flotilla operator`'s namespaced mode: namespaces named exactly turn off kopf's cluster-wide
scanning of CRDs and namespaces, so a Role in each namespace is all the operator needs."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from flotilla.operator import handlers, main


@pytest.fixture
def started(monkeypatch) -> dict[str, Any]:
    """`main` up to kopf.run, which records what it was given instead of running."""
    monkeypatch.setenv("FLOTILLA_OPERATOR_INTERVAL", "5")  # main sets it; restored after
    monkeypatch.setenv("FLOTILLA_METRICS_PORT", "0")  # no metrics server in the test process
    for name in ("FLOTILLA_LOG_FORMAT", "FLOTILLA_LOG_LEVEL"):  # a developer's shell's
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(main, "kubernetes_config_problem", lambda: None)
    monkeypatch.setattr(handlers, "STATIC_NAMESPACES", False)
    seen: dict[str, Any] = {}
    # main sets up the logging of its process: not of this test process
    monkeypatch.setattr(main.logs, "configure",
                        lambda log_format, level, **_: seen.update(logs=(log_format, level)))
    monkeypatch.setattr(kopf, "run", lambda **kw: seen.update(kw))
    return seen


def scanning_disabled() -> bool:
    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings, memo=kopf.Memo())
    return settings.scanning.disabled


def test_only_what_the_operator_made_is_watched_besides_raftclusters():
    settings, memo = kopf.OperatorSettings(), kopf.Memo()
    handlers.configure(settings=settings, memo=memo)
    selectors = {selector.any_name: value
                 for selector, value in settings.watching.label_selectors.items()}
    assert selectors == dict.fromkeys(("statefulsets", "pods", "jobs", "configmaps", "services",
                                       "poddisruptionbudgets", "networkpolicies"),
                                      "app.kubernetes.io/managed-by=flotilla-operator")
    assert memo.wakers == {} and memo.applied == {}


def test_exact_namespaces_need_no_cluster_wide_scanning(started):
    assert main.main(["-n", "team-a", "--namespace", "team-b"]) == 0
    assert (started["clusterwide"], list(started["namespaces"])) == (False, ["team-a", "team-b"])
    assert scanning_disabled() is True


@pytest.mark.parametrize("argv", [["--all-namespaces"], [], ["-n", "team-*"],
                                  ["-n", "team-a", "-n", "!kube-system"]])
def test_all_namespaces_or_patterns_keep_kopf_scanning(started, argv):
    assert main.main(argv) == 0
    assert scanning_disabled() is False


@pytest.mark.parametrize(("argv", "env", "logs"), [
    ([], {}, ("text", "info")),
    (["--log-format", "JSON", "--log-level", "warning"], {}, ("json", "warning")),
    (["-v"], {}, ("text", "debug")),
    (["-v", "--log-level", "error"], {}, ("text", "error")),
    ([], {"FLOTILLA_LOG_FORMAT": "json", "FLOTILLA_LOG_LEVEL": "warning"}, ("json", "warning")),
    (["--log-format", "text"], {"FLOTILLA_LOG_FORMAT": "json"}, ("text", "info")),
])
def test_the_log_flags_and_their_environment_set_up_the_operators_logs(started, monkeypatch,
                                                                      argv, env, logs):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main.main(argv) == 0
    assert started["logs"] == logs
