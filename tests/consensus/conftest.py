"""Every test of the hand-driven network runs twice: with the leader announcing each new
commit index at once (etcd's raft) and lazily (Settings.lazy_commit, what members run)."""

import pytest

from tests.consensus import network


@pytest.fixture(autouse=True, params=[False, True], ids=["eager-commit", "lazy-commit"])
def commit_announcement(request, monkeypatch):
    monkeypatch.setattr(network, "DEFAULT_SETTINGS", {"lazy_commit": request.param})
    return request.param
