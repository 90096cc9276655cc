"""Process-level fault tests: real ``flotilla node`` processes, killed, paused, cut off and
reconfigured while concurrent clients record a history that is checked for linearizability."""

from tests.harness.fixtures import local_cluster  # noqa: F401 (a fixture)
