"""Shared by the operator tests that reconcile in this process."""

from __future__ import annotations

import pytest
from flotilla.operator import tlsassets


@pytest.fixture(autouse=True)
def fresh_secrets_memory():
    """The operator remembers the Secrets it read (per cluster uid) for a minute: tests that
    reuse a uid with a new in-memory API must not see another test's."""
    tlsassets.forget()
    yield
    tlsassets.forget()


@pytest.fixture
def kmock_api():
    """A kmock API server of its own (kmock answers more slowly as it holds more objects) for
    a test that reconciles in this process against it, and a Kube client of it."""
    from tests.operator.kubelet import Kmock

    server = Kmock().start()
    try:
        yield server.api()
    finally:
        server.stop()
