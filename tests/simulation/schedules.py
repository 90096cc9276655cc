"""Seeded random schedules: a workload, a mix of faults and membership changes, then healing.

`run_schedule(seed)` is a pure function of the seed. Each schedule picks its own cluster size,
fault rates and action probabilities from the seed, so the seeds together cover calm runs,
lossy networks, partitions of every shape, crash storms and membership churn, and most mix
several at once. After the fault phase everything heals; the cluster must then elect a leader,
finish any membership change, commit every client write and bring every member up to date
within `HEAL_TICKS`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from .cluster import TICK, KVState, SafetyViolation, Simulation
from .disk import Disk

HEAL_TICKS = 400  # 40 election timeouts
KEYS = ["a", "b", "c", "d", "e"]


class LivenessViolation(AssertionError):
    pass


@dataclass
class Mix:
    """How hostile one schedule is; drawn from its seed."""

    loss: float
    duplicate: float
    max_delay: int
    partition: float
    crash: float
    snapshot: float
    membership: float
    transfer: float
    write: float
    read: float
    fault_ticks: int

    @classmethod
    def draw(cls, rng) -> Mix:
        def maybe(p: float, hi: float) -> float:
            return rng.uniform(0, hi) if rng.random() < p else 0.0

        return cls(
            loss=maybe(0.6, 0.25),
            duplicate=maybe(0.5, 0.15),
            max_delay=rng.choice([4, 8, 20, 40]),
            partition=maybe(0.6, 0.06),
            crash=maybe(0.6, 0.04),
            snapshot=maybe(0.7, 0.1),
            membership=maybe(0.6, 0.06),
            transfer=maybe(0.4, 0.03),
            write=rng.uniform(0.2, 0.9),
            read=rng.uniform(0.0, 0.5),
            fault_ticks=rng.randint(60, 160),
        )


def run_schedule(seed: int, verbose: bool = False) -> Simulation:
    """Run one schedule; raises SafetyViolation or LivenessViolation with the seed."""
    import random

    pick = random.Random(seed * 7919 + 1)
    size = pick.choice([1, 3, 3, 4, 5, 5])
    names = [f"n{i}" for i in range(1, size + 1)]
    sim = Simulation(seed, names)
    mix = Mix.draw(pick)
    rng = sim.rng
    sim.faults.loss = mix.loss
    sim.faults.duplicate = mix.duplicate
    sim.faults.max_delay = mix.max_delay
    next_name = size + 1

    def alive_names() -> list[str]:
        return sorted(n.name for n in sim.alive())

    for _tick in range(mix.fault_ticks):
        sim.run_until(sim.now + TICK)
        sim.retry_writes()
        if rng.random() < mix.write:
            for _ in range(rng.randint(1, 3)):
                sim.propose_write(rng.randrange(4), rng.choice(KEYS))
        if rng.random() < mix.read and sim.alive():
            sim.start_read(rng.choice(sim.alive()), rng.choice(KEYS))
        if rng.random() < mix.partition:
            _partition(sim, rng)
        if rng.random() < mix.partition * 1.5:
            sim.faults.blocked.clear()
            sim.log("partition healed")
        if rng.random() < mix.crash and sim.alive():
            victim = rng.choice(alive_names())
            sim.crash(victim, rng.randint(1, 60) * TICK)
        if rng.random() < mix.snapshot and sim.alive():
            sim.take_snapshot(rng.choice(sim.alive()), rng.choice([0, 0, 2, 5]))
        if rng.random() < mix.transfer:
            leader = sim.leader()
            if leader is not None:
                voters = sorted(leader.core.membership.voters - {leader.name})
                if voters:
                    sim.transfer(rng.choice(voters))
        if rng.random() < mix.membership:
            next_name = _change_membership(sim, rng, next_name)

    # Heal: no more faults; every crashed member comes back; clients keep retrying.
    sim.faults.clear()
    sim.log("healing")
    for node in sim.nodes.values():
        if not node.alive:
            node.start()
            sim.schedule(rng.randrange(TICK), "tick", (node.name, node.incarnation))
    for tick in range(HEAL_TICKS):
        sim.run_until(sim.now + TICK)
        sim.retry_writes()
        if tick % 10 == 0 and sim.alive():
            sim.start_read(rng.choice(sim.alive()), rng.choice(KEYS))
        if _converged(sim):
            sim.heal_ticks = tick
            break
    else:
        raise LivenessViolation(f"seed {seed}: not converged {HEAL_TICKS} ticks after healing: "
                                f"{_describe(sim)}\n" + "\n".join(sim.trace))
    if verbose:
        print(f"seed {seed}: size {size}, {mix}")
        print(f"  stats {sim.stats}, writes {len(sim.writes)}, reads {sim.reads_done}, "
              f"committed {sim.checker.commit_index}, healed in {sim.heal_ticks} ticks")
    return sim


def _partition(sim: Simulation, rng) -> None:
    names = sorted(sim.nodes)
    if len(names) < 2:
        return
    if rng.random() < 0.5:
        rng.shuffle(names)
        cut = rng.randint(1, len(names) - 1)
        a, b = names[:cut], names[cut:]
        for x in a:
            for y in b:
                sim.faults.blocked.add((x, y))
                sim.faults.blocked.add((y, x))
        sim.log(f"partition {a} | {b}")
    else:
        for _ in range(rng.randint(1, len(names))):
            x, y = rng.sample(names, 2)
            sim.faults.blocked.add((x, y))
            sim.log(f"cut {x} -> {y}")


def _change_membership(sim: Simulation, rng, next_name: int) -> int:
    leader = sim.leader()
    if leader is None:
        return next_name
    current = leader.core.membership
    if current.joint or leader.core.log.membership_index() > leader.core.log.committed:
        return next_name
    voters, learners = set(current.voters), set(current.learners)
    choice = rng.random()
    if choice < 0.35 and len(sim.nodes) < 8:
        name = f"n{next_name}"
        next_name += 1
        sim.add_node(name, Disk(snapshot_data=KVState()))  # joins empty (`existing` mode)
        sim.log(f"{name} started empty")
        sim.change_membership(voters, learners | {name})
    elif choice < 0.45 and learners:
        sim.change_membership(voters, learners - {rng.choice(sorted(learners))})
    else:
        pool = sorted(voters | learners)
        target = set(rng.sample(pool, rng.randint(1, min(5, len(pool)))))
        if rng.random() < 0.3:
            target.discard(leader.name)  # remove the leader's own member
        if target and target != voters:
            sim.change_membership(target, learners - target)
    return next_name


def _converged(sim: Simulation) -> bool:
    leader = sim.leader()
    if leader is None:
        return False
    core = leader.core
    m = core.membership
    if m.joint or core.log.membership_index() > core.log.committed:
        return False
    if not all(w.acked for w in sim.writes):
        return False
    if core.log.term(core.log.committed) != core.term:
        return False
    for name in m.members():
        node = sim.nodes.get(name)
        if node is None or not node.alive or node.sm.applied < core.log.committed:
            return False
        if node.core.leader != leader.name:
            return False
    return True


def _describe(sim: Simulation) -> str:
    parts = []
    for name, node in sorted(sim.nodes.items()):
        if not node.alive:
            parts.append(f"{name}: down")
            continue
        c = node.core
        parts.append(f"{name}: {c.role.name} term {c.term} leader {c.leader} last "
                     f"{c.log.last_index()} commit {c.log.committed} applied {node.sm.applied} "
                     f"config {sorted(c.membership.voters)}"
                     f"{' joint' if c.membership.joint else ''}")
    unacked = sum(1 for w in sim.writes if not w.acked)
    return "; ".join(parts) + f"; unacknowledged writes {unacked}"


def replay_command(seed: int) -> str:
    return f"python -m tests.simulation --seed {seed} --verbose"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation",
                                     description="Replay simulated Raft schedules by seed.")
    parser.add_argument("--seed", type=int, default=None, help="run only this seed")
    parser.add_argument("--count", type=int, default=100, help="seeds to run from --start")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.count)
    failures = 0
    for seed in seeds:
        try:
            run_schedule(seed, verbose=args.verbose)
        except (SafetyViolation, LivenessViolation) as exc:
            failures += 1
            print(f"FAILED {exc}", file=sys.stderr)
    print(f"{len(seeds)} schedules, {failures} failed")
    return 1 if failures else 0
