"""Progress on long work: the restore's progress file, the bars drawn from it and from a
learner's catch-up."""

from __future__ import annotations

import io
import json
from pathlib import Path

from flotilla.node.archive import ClusterArchive, open_archive
from flotilla.node.restore import ProgressFile
from flotilla.operator.memberstatus import MemberStatus
from flotilla.operator.planner import Action, Plan, Record, Step

from flotilla import local
from flotilla.progress import Bar, read_restore_progress
from flotilla.scaling import _show_catch_up
from tests.harness.fixtures import require_node


def test_a_bar_shows_amounts_rate_and_time_left_and_a_new_one_per_stage():
    out = io.StringIO()
    with Bar(file=out, disable=False) as bar:
        bar.show("fetch", "n1 fetching from the archive", 0, 4096, "B")
        bar.show("fetch", "n1 fetching from the archive", 4096, 4096, "B")
        bar.show("replay", "n1 replaying", 500, 1000, "entries")
    text = out.getvalue()
    assert "n1 fetching from the archive: 100%" in text and "4.00k/4.00k" in text
    assert "B/s" in text
    assert "n1 replaying:  50%" in text and "500/1.00k" in text and "entries/s" in text
    assert "<" in text  # tqdm's elapsed<remaining


def test_the_progress_file_keeps_each_stage_s_ends_and_is_gone_after(tmp_path: Path):
    progress = ProgressFile(tmp_path / "restore.progress", interval=3600)
    progress("replay", 0, 10, "entries")
    progress("replay", 5, 10, "entries")  # within the interval: skipped
    assert read_restore_progress(tmp_path)["done"] == 0
    progress("replay", 10, 10, "entries")  # a stage's end is always written
    assert read_restore_progress(tmp_path) == {"stage": "replay", "done": 10, "total": 10,
                                               "unit": "entries"}
    progress.remove()
    assert read_restore_progress(tmp_path) is None
    (tmp_path / "restore.progress").write_text(json.dumps({"stage": "x"}))
    assert read_restore_progress(tmp_path) is None  # half a document is no progress


def test_a_restore_reports_every_byte_it_fetches_and_leaves_no_progress_file(tmp_path):
    require_node()
    cluster, _ = local.up(tmp_path / "old", 1, election_timeout_ms=500, heartbeat_ms=50)
    try:
        with cluster.client(timeout=10) as c:
            for i in range(50):
                c.put(f"k{i}", b"v" * 100)
            c.snapshot()
            for i in range(50):
                c.put(f"later{i}", b"w")
            c.snapshot()  # ships the entries after the first snapshot too
    finally:
        cluster.stop(timeout=5)
    archive = open_archive(cluster.state.archive)
    try:
        seen: list[tuple[int, int]] = []
        prepared = ClusterArchive(archive, cluster.state.cluster_id).prepare_restore(
            tmp_path / "work", 60, lambda done, total: seen.append((done, total)))
    finally:
        archive.close()
    assert seen[0][0] == 0 and seen[-1][0] == seen[-1][1] > 0
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert prepared.plan.segments  # 60 is past the first snapshot: a snapshot + segments

    restored, _ = local.up(tmp_path / "new", 1, restore_from=cluster.state.archive,
                           election_timeout_ms=500, heartbeat_ms=50)
    try:
        with restored.client(timeout=10) as c:
            assert c.get("later49").value == b"w"
        assert read_restore_progress(restored.member("n1").data_dir) is None
    finally:
        restored.stop(timeout=5)


def test_scale_draws_the_slowest_learner_against_the_commit_index():
    def waiting(n2: int, n3: int) -> Plan:
        status = MemberStatus.parse({
            "name": "n1", "role": "leader", "commit_index": 900,
            "config": {"voters": ["n1"], "learners": ["n2", "n3"]},
            "members": {"n1": {"match_index": 900}, "n2": {"match_index": n2},
                        "n3": {"match_index": n3}}})
        return Plan(Action(Step.WAIT, "learners catching up"), Record(), "Scaling",
                    leader_status=status)

    out = io.StringIO()
    with Bar(file=out, disable=False) as bar:
        _show_catch_up(waiting(300, 600), bar)
        assert "n2, n3 catching up:  33%" in out.getvalue() and "300/900" in out.getvalue()
        _show_catch_up(waiting(900, 600), bar)
        assert "n3 catching up:  67%" in out.getvalue()
        _show_catch_up(waiting(900, 900), bar)
        assert bar._bar is None  # nobody behind: the bar is gone
