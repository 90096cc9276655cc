"""The bad-input suites share one 3-member cluster per module (``cluster``) and the canary
that checks it still serves and lost nothing after each bad input (``canary``); process tests
of their own clusters use ``local_cluster``."""

from tests.harness.fixtures import local_cluster  # noqa: F401 (a fixture)
from tests.node.badinput import canary, cluster  # noqa: F401 (fixtures)
