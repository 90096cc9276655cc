"""Shared pytest configuration."""

from tests.simulation.test_random_schedules import SUMMARY_KEY


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in config.stash.get(SUMMARY_KEY, []):
        terminalreporter.write_line(line)
