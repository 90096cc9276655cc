"""`flotilla scale N`: the local adapter of the operator's planner.

It observes the local cluster (which member processes run, each one's own `/v1/status`, which
data dirs exist), asks `flotilla.operator.planner.plan` for the next single step, carries it
out with processes and admin calls, and observes again, until the configuration is exactly
the first N slots as voters, not joint. The Kubernetes operator takes the same steps with pods
and volumes instead of processes and directories, so this is the planner tested for real.

The planner's record (member uids, removed uids, learners' catch-up clocks) is kept in the
state file, so a `scale` that was interrupted resumes where it was.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from flotilla.client import FlotillaError
from flotilla.local import (
    HOST,
    SIGNING_KEY_FLAG,
    STATE_MACHINE_FLAG,
    LocalCluster,
    LocalClusterError,
    Member,
    forget_member_certificate,
    free_ports,
    issue_member_certificate,
    locked,
    tls_args,
)
from flotilla.operator.members import ADMIN_TIMEOUT, MEMBERSHIP_STEPS, call
from flotilla.operator.memberstatus import MemberStatus
from flotilla.operator.planner import Action, Observed, Plan, Record, Slot, Step, plan
from flotilla.progress import Bar

__all__ = ["scale", "slot_name"]


def slot_name(index: int) -> str:
    """Local slots are n1, n2, ... (index 0 is n1)."""
    return f"n{index + 1}"


def scale(root: Path | str, replicas: int, *, timeout: float = 300.0,
          catch_up_timeout: float = 600.0, keep_removed_data: bool = False,
          say: Callable[[str], None] = lambda _text: None) -> Plan:
    """Change the cluster in `root` to exactly `replicas` voters; returns the final plan (its
    action is DONE). Raises LocalClusterError when time runs out, with what it waited for."""
    if replicas < 1:
        raise LocalClusterError(f"a cluster needs at least 1 voter, not {replicas}")
    with locked(root):
        cluster = LocalCluster.load(root)
        if not cluster.alive():
            raise LocalClusterError(f"the cluster in {root} is not running; start it with "
                                    f"`flotilla up --dir {root}`")
        return _Scaler(cluster, replicas, catch_up_timeout, not keep_removed_data,
                       say).run(timeout)


class _Scaler:
    def __init__(self, cluster: LocalCluster, replicas: int, catch_up_timeout: float,
                 delete_removed: bool, say: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.replicas = replicas
        self.catch_up_timeout = catch_up_timeout
        self.delete_removed = delete_removed
        self.say = say

    def run(self, timeout: float) -> Plan:
        with Bar() as bar:
            return self._run(timeout, bar)

    def _run(self, timeout: float, bar: Bar) -> Plan:
        deadline = time.monotonic() + timeout
        last_wait = None
        while True:
            result = plan(self.observe())
            _show_catch_up(result, bar)
            self.cluster.state.record = result.record.to_json()
            self.cluster.save()
            action = result.action
            if action.step is Step.DONE:
                self.say(f"done: {action.reason}")
                return result
            if time.monotonic() > deadline:
                raise LocalClusterError(f"the cluster did not reach {self.replicas} voters "
                                        f"within {timeout:g}s; last step: "
                                        f"{action.describe()}")
            if action.step is Step.WAIT:
                if action.reason != last_wait:
                    self.say(f"waiting: {action.reason}")
                    last_wait = action.reason
                time.sleep(0.2)
                continue
            last_wait = None
            self.say(action.describe())
            try:
                self.carry_out(action)
            except FlotillaError as exc:  # 409 while the leader finishes a change, 422, 503
                self.say(f"  not yet ({exc}); planning again")
                time.sleep(0.5)

    # --- observing ------------------------------------------------------------------------

    def observe(self) -> Observed:
        cluster = self.cluster
        size = len(cluster.members)
        left_behind = [int(p.name[1:]) for p in cluster.root.glob("n*")
                       if p.is_dir() and p.name[1:].isdigit()]  # removed slots' data dirs
        count = max(size, self.replicas, *left_behind)
        names = [slot_name(i) for i in range(count)]
        slots = {}
        for name in names:
            data_dir = cluster.root / name
            if name not in cluster.names:
                slots[name] = Slot(running=False, volume=data_dir.exists())
                continue
            running = cluster.is_alive(name)
            status = (MemberStatus.parse(cluster.member_status(name, timeout=1.0), name)
                      if running else None)
            slots[name] = Slot(running=running, status=status,
                               exit_code=None if running else cluster.exit_code(name),
                               volume=data_dir.exists())
        record = Record.from_json(cluster.state.record)
        return Observed(desired=self.replicas, size=size, slots=slots, names=names,
                        record=record, now=time.time(),
                        catch_up_timeout=self.catch_up_timeout,
                        delete_removed_volumes=self.delete_removed)

    # --- acting ---------------------------------------------------------------------------

    def carry_out(self, action: Action) -> None:
        cluster = self.cluster
        if action.step is Step.RESIZE:
            self.resize(action.size or 0)
        elif action.step in MEMBERSHIP_STEPS:
            joining = (cluster.member(action.member) if action.step is Step.ADD_LEARNER
                       else None)
            with cluster.client(timeout=ADMIN_TIMEOUT) as client:
                call(client, action, joining.peer_url if joining else "",
                     joining.client_url if joining else "")
        elif action.step is Step.RESET_VOLUME:
            cluster.kill(action.member)
            shutil.rmtree(cluster.member(action.member).data_dir, ignore_errors=True)
            cluster.start([action.member])
        elif action.step is Step.DELETE_VOLUME:
            shutil.rmtree(cluster.root / action.member, ignore_errors=True)
        else:
            raise AssertionError(f"no local way to {action.describe()}")

    def resize(self, size: int) -> None:
        """Start empty members in the new slots, or stop the members of slots beyond `size`
        (the planner only shrinks once they have left the configuration)."""
        cluster = self.cluster
        members = cluster.state.members
        if size < len(members):
            leaving = [m.name for m in members[size:]]
            cluster.stop(timeout=10, names=leaving)
            cluster.state.members = members[:size]
            cluster.save()
            for name in leaving:  # a slot that comes back gets a new certificate
                forget_member_certificate(cluster.root, name)
            return
        new = [slot_name(i) for i in range(len(members), size)]
        ports = free_ports(2 * len(new))
        for i, name in enumerate(new):
            members.append(_joining_member(cluster, name, ports[i], ports[len(new) + i]))
        cluster.save()
        cluster.start(new)


def _joining_member(cluster: LocalCluster, name: str, peer: int, client: int) -> Member:
    """A member for a new slot: it starts empty in `existing` mode and waits to be added. In a
    TLS cluster, the cluster's CA issues its certificate first."""
    state = cluster.state
    data_dir = str(cluster.root / name)
    args = [
        "--name", name,
        "--data-dir", data_dir,
        "--listen-peer", f"{HOST}:{peer}",
        "--listen-client", f"{HOST}:{client}",
        "--initial-cluster-state", "existing",
        "--cluster-id", state.cluster_id,
        "--election-timeout-ms", str(state.election_timeout_ms),
        "--heartbeat-ms", str(state.heartbeat_ms),
    ]
    if state.archive_passed and state.archive:
        args += ["--archive", state.archive]
    key_files = state.members[0].flag(SIGNING_KEY_FLAG) if state.members else None
    if key_files:  # it signs what it archives once it leads, as the others do
        args += [SIGNING_KEY_FLAG, key_files]
    machine = state.members[0].flag(STATE_MACHINE_FLAG) if state.members else None
    if machine:  # it replicates the same machine as the others
        args += [STATE_MACHINE_FLAG, machine]
    if state.tls:
        issue_member_certificate(cluster.root, name)
        args += tls_args(cluster.root, name)
    return Member(name, peer, client, data_dir, str(cluster.root / f"{name}.log"), args,
                  tls=state.tls)


def _show_catch_up(result: Plan, bar: Bar) -> None:
    """While learners catch up, a bar of the slowest one's match index against the leader's
    commit index (entries, rate, time left); closed once none is behind."""
    lead = result.leader_status
    if lead is None:
        bar.close()
        return
    commit = lead.commit_index
    behind = {name: lead.match(name) or 0 for name in lead.config.learners}
    behind = {name: match for name, match in behind.items() if match < commit}
    if not behind:
        bar.close()
        return
    slowest = min(behind, key=behind.__getitem__)
    names = ", ".join(sorted(behind))
    bar.show(f"catch-up {names}", f"{names} catching up", behind[slowest], commit, "entries")
