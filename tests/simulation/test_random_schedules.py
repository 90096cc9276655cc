"""Thousands of seeded schedules mixing every fault with membership changes.

Each schedule is replayed exactly from its seed; a failure names the seed and the command
that replays it. `FLOTILLA_SIM_SCHEDULES` (default 2000) and `FLOTILLA_SIM_START` choose
the seeds, so a long soak is `FLOTILLA_SIM_SCHEDULES=50000 pytest tests/simulation`.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback

import pytest

from .cluster import SafetyViolation
from .schedules import LivenessViolation, replay_command, run_schedule

SCHEDULES = int(os.environ.get("FLOTILLA_SIM_SCHEDULES", "2000"))
START = int(os.environ.get("FLOTILLA_SIM_START", "0"))


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


def test_random_schedules_keep_raft_safe_and_live(request):
    seeds = range(START, START + SCHEDULES)
    workers = min(2, os.cpu_count() or 1)
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        results = list(pool.imap_unordered(_run, seeds, chunksize=20))
    failures = sorted((seed, err) for seed, err, _ in results if err)
    totals: dict[str, int] = {}
    worst_heal = 0
    for _, err, facts in results:
        if err is None:
            worst_heal = max(worst_heal, facts.pop("heal_ticks"))
            for key, value in facts.items():
                totals[key] = totals.get(key, 0) + value
    last = START + SCHEDULES - 1
    summary = (f"simulation: {len(results)} schedules ran (seeds {START}..{last}), "
               f"{len(failures)} failed; totals {totals}; slowest recovery after healing "
               f"{worst_heal} ticks")
    request.config.stash.setdefault(SUMMARY_KEY, []).append(summary)
    if failures:
        shown = "\n\n".join(
            f"seed {seed}: replay with `{replay_command(seed)}`\n{err[:1500]}"
            for seed, err in failures[:5]
        )
        pytest.fail(f"{len(failures)} of {len(results)} schedules failed "
                    f"(seeds {[s for s, _ in failures][:20]}):\n\n{shown}")
    assert len(results) == SCHEDULES
    assert totals["membership"] > 0 and totals["crashes"] > 0 and totals["installs"] > 0
    assert totals["transfers"] > 0 and totals["reads"] > 0 and totals["dropped"] > 0


SUMMARY_KEY = pytest.StashKey[list]()
