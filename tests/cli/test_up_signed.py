"""`flotilla up --archive-signing-key-file F`: every member signs the manifests it archives with
the key and restores only from manifests that verify with it; `up` checks a restore's
manifests itself before it starts any member."""

from __future__ import annotations

import json
from pathlib import Path

from flotilla.node.archive import ManifestKeys, SigningKey
from flotilla.node.statemachine.kv import encode_put

from flotilla import local
from tests.cli.test_up_restore_time import UP_FAST, assert_nothing_left, flotilla, one_line
from tests.harness.cli import flotilla as run_flotilla
from tests.pipeline.archives import write_archive

SECRET = b"local-cluster-signing-key-0123456"
KEY = ManifestKeys((SigningKey.from_secret(SECRET),))


def test_up_forwards_the_key_to_every_member_and_restores_only_what_verifies(tmp_path: Path):
    url = (tmp_path / "archive").as_uri()
    write_archive(url, "prod", [encode_put("k", b"signed", ts=1)], keys=KEY)
    (tmp_path / "archive.key").write_bytes(SECRET)
    (tmp_path / "other.key").write_bytes(b"another-key-of-32-bytes-00000000")
    (tmp_path / "short.key").write_bytes(b"short")
    root = tmp_path / ".flotilla"

    short = run_flotilla("up", "--restore-from", url, cwd=tmp_path, text=True,
                         env={"FLOTILLA_ARCHIVE_SIGNING_KEY_FILE": "short.key"})
    assert short.returncode == 2, short.stdout + short.stderr
    assert "--archive-signing-key-file: the signing key file short.key holds 5 bytes" in \
        one_line(short)
    wrong = flotilla(tmp_path, "up", "--replicas", "1", "--restore-from", url,
                     "--archive-signing-key-file", "other.key", *UP_FAST)
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    line = one_line(wrong)
    assert "prod/manifests/" in line and "not among the signing keys given" in line, line
    assert_nothing_left(root)

    up = flotilla(tmp_path, "up", "--replicas", "1", "--restore-from", url,
                  "--archive-signing-key-file", "archive.key", *UP_FAST)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        [member] = local.LocalCluster.load(root).members
        flag = member.args.index("--archive-signing-key-file")
        assert member.args[flag + 1] == str(tmp_path / "archive.key"), member.args
        got = flotilla(tmp_path, "kv", "get", "k")
        assert got.returncode == 0 and got.stdout.strip() == "signed", got
        shipped = flotilla(tmp_path, "snapshot")
        assert shipped.returncode == 0, shipped.stdout + shipped.stderr
        cluster_id = local.LocalCluster.load(root).state.cluster_id
        manifests = sorted((root / "archive" / cluster_id / "manifests").glob("*.json"))
        assert manifests, "the restored cluster archived nothing"
        for path in manifests:
            assert json.loads(path.read_bytes())["mac"]["key_id"] == KEY.key_ids[0], path
        # A stopped cluster resumes with the key it first ran with, and says so if not given.
        assert flotilla(tmp_path, "down").returncode == 0
        again = flotilla(tmp_path, "up", *UP_FAST)
        assert again.returncode == 0, again.stdout + again.stderr
        assert (f"note: resuming with the original --archive-signing-key-file "
                f"({tmp_path / 'archive.key'})") in again.stdout, again.stdout
    finally:
        flotilla(tmp_path, "down")
