"""Thousands of seeded schedules mixing every fault with membership changes.

Each schedule is replayed exactly from its seed; a failure names the seed and the command
that replays it. `FLOTILLA_SIM_SCHEDULES` (default 2000) and `FLOTILLA_SIM_START` choose
the seeds, so a long soak is `FLOTILLA_SIM_SCHEDULES=50000 pytest tests/simulation`.

The seeds run in chunks of `CHUNK`, one test each, so that pytest shows progress; one pool of
workers serves them all. The last test checks what only the whole run can show (every seed
ran, every kind of fault happened), and the session ends with one summary line of the run.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.pool import Pool

import pytest

from .cluster import SafetyViolation
from .schedules import LivenessViolation, replay_command, run_schedule

SCHEDULES = int(os.environ.get("FLOTILLA_SIM_SCHEDULES", "2000"))
START = int(os.environ.get("FLOTILLA_SIM_START", "0"))
CHUNK = 100
CHUNKS = [range(first, min(first + CHUNK, START + SCHEDULES))
          for first in range(START, START + SCHEDULES, CHUNK)]

# Lines tests/conftest.py prints in the terminal summary.
SUMMARY_KEY = pytest.StashKey[list]()


def _run(seed: int) -> tuple[int, str | None, dict]:
    try:
        sim = run_schedule(seed)
    except (SafetyViolation, LivenessViolation) as exc:
        return seed, f"{type(exc).__name__}: {exc}", {}
    except Exception:  # a crash of the core or the harness is a failure with a seed too
        return seed, traceback.format_exc(), {}
    facts = dict(sim.stats)
    facts.update(writes=len(sim.writes), reads=sim.checker.reads_checked,
                 committed=sim.checker.commit_index, heal_ticks=sim.heal_ticks)
    return seed, None, facts


@dataclass
class Outcome:
    """What the chunks that ran so far add up to."""

    ran: int = 0
    failures: list[tuple[int, str]] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)
    worst_heal: int = 0

    def add(self, results: list[tuple[int, str | None, dict]]) -> None:
        self.ran += len(results)
        for seed, err, facts in results:
            if err is not None:
                self.failures.append((seed, err))
                continue
            facts = dict(facts)
            self.worst_heal = max(self.worst_heal, facts.pop("heal_ticks"))
            for key, value in facts.items():
                self.totals[key] = self.totals.get(key, 0) + value

    def summary(self) -> str:
        last = START + SCHEDULES - 1
        failed = sorted(seed for seed, _ in self.failures)
        return (f"simulation: {self.ran} of the {SCHEDULES} schedules (seeds {START}..{last}) ran, "
                f"{len(failed)} failed{f' (seeds {failed[:20]})' if failed else ''}; "
                f"totals {self.totals}; slowest recovery after healing {self.worst_heal} ticks")


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    # Under pytest-xdist the other workers run tests of their own: one process here.
    workers = 1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1)
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield pool


@pytest.fixture(scope="module")
def outcome(pytestconfig: pytest.Config) -> Iterator[Outcome]:
    outcome = Outcome()
    yield outcome
    if outcome.ran:
        pytestconfig.stash.setdefault(SUMMARY_KEY, []).append(outcome.summary())


@pytest.mark.parametrize("seeds", CHUNKS, ids=lambda seeds: f"seeds{seeds.start}-{seeds[-1]}")
def test_random_schedules_keep_raft_safe_and_live(seeds: range, pool: Pool,
                                                  outcome: Outcome) -> None:
    results = list(pool.imap_unordered(_run, seeds, chunksize=5))
    outcome.add(results)
    failures = sorted((seed, err) for seed, err, _ in results if err)
    if failures:
        shown = "\n\n".join(
            f"seed {seed}: replay with `{replay_command(seed)}`\n{err[:1500]}"
            for seed, err in failures[:5]
        )
        pytest.fail(f"{len(failures)} of {len(results)} schedules failed "
                    f"(seeds {[s for s, _ in failures][:20]}):\n\n{shown}")
    assert len(results) == len(seeds)


def test_the_schedules_together_ran_every_seed_and_every_fault(outcome: Outcome) -> None:
    """Runs after the chunks (pytest keeps a module's order): checks what they add up to."""
    assert outcome.ran == SCHEDULES, (
        f"only {outcome.ran} of {SCHEDULES} schedules ran: select every chunk of "
        "test_random_schedules_keep_raft_safe_and_live with this test")
    totals = outcome.totals
    assert totals["membership"] > 0 and totals["crashes"] > 0 and totals["installs"] > 0
    assert totals["transfers"] > 0 and totals["reads"] > 0 and totals["dropped"] > 0
