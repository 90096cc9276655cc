"""The data dir's identity: which cluster and which member it belongs to.

Written once, at a member's first start, before anything else lands in the directory. Every
later start checks it, so a volume re-attached to the wrong pod, or a `--data-dir` pointed at
another cluster's files, is refused instead of silently merged into a log it never belonged
to. The random `member_uid` is what a removed member's reused volume cannot fake: the cluster
records the uid it removed, and a name alone would come back.

The file is JSON because operators read it (`cat identity.json` answers "whose disk is this?").
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from .dirlock import LOCK_FILE
from .errors import CorruptDataError, DataDirError
from .fsutil import TEMP_SUFFIX, ensure_dir, remove_temp_files, write_atomic

T = TypeVar("T")

IDENTITY_FILE = "identity.json"
FORMAT = 1


@dataclass(frozen=True, slots=True)
class Identity:
    cluster_id: str
    member_name: str
    member_uid: str


@dataclass(frozen=True, slots=True)
class DataDir:
    """An opened data dir. `created` is True on the member's first start (the dir was empty),
    which is when `--initial-cluster` and the restore flags apply."""

    path: Path
    identity: Identity
    created: bool

    @property
    def snapshot_dir(self) -> Path:
        return self.path / "snap"

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        cluster_id: str,
        member_name: str,
        fsync: bool = True,
    ) -> DataDir:
        """Open (creating on first start) the data dir of member `member_name` of `cluster_id`.

        Raises DataDirError if it belongs to another cluster or member, or holds files but no
        identity; CorruptDataError if the identity file is unreadable. A process that runs a
        member takes the dir's lock (`lock_data_dir`) before this.
        """
        root = Path(path)
        ensure_dir(root, fsync=fsync)
        remove_temp_files(root)
        identity = read_identity(root)
        if identity is None:
            others = sorted(p.name for p in root.iterdir()
                            if not p.name.endswith(TEMP_SUFFIX) and p.name != LOCK_FILE)
            if others:
                raise DataDirError(
                    f"data dir {root} holds files ({', '.join(others[:5])}) but no "
                    f"{IDENTITY_FILE}: it is not a Flotilla data dir, or its identity was lost. "
                    "Point --data-dir at an empty directory (a new member), or restore this "
                    "member from its peers"
                )
            identity = Identity(cluster_id, member_name, uuid.uuid4().hex)
            document = {"format": FORMAT, **asdict(identity)}
            write_atomic(
                root / IDENTITY_FILE, json.dumps(document, indent=2).encode() + b"\n", fsync=fsync
            )
            return cls(root, identity, created=True)
        if identity.cluster_id != cluster_id:
            raise DataDirError(
                f"data dir {root} belongs to cluster {identity.cluster_id!r}, not "
                f"{cluster_id!r} (see {root / IDENTITY_FILE}). Check --cluster-id and "
                "--data-dir; to join this cluster as a new member, use an empty data dir"
            )
        if identity.member_name != member_name:
            raise DataDirError(
                f"data dir {root} belongs to member {identity.member_name!r} of cluster "
                f"{cluster_id!r}, not to {member_name!r} (see {root / IDENTITY_FILE}). Check "
                "--name and --data-dir: two members must never share one log"
            )
        return cls(root, identity, created=False)


def read_identity(root: Path) -> Identity | None:
    """The identity recorded in data dir `root`, or None if it has none yet."""

    def parse(document: dict) -> Identity:
        if document.get("format") != FORMAT:
            raise ValueError(f"unknown format {document.get('format')!r}")
        return Identity(
            cluster_id=_text(document, "cluster_id"),
            member_name=_text(document, "member_name"),
            member_uid=_text(document, "member_uid"),
        )

    return _read_document(root / IDENTITY_FILE, "identity", parse)


def _read_document(path: Path, what: str, parse: Callable[[dict], T]) -> T | None:
    """A small JSON file of the data dir, parsed; None if it does not exist. One that does not
    parse is corruption (exit 3), never silently taken for absent."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return parse(json.loads(raw))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptDataError(path, 0, f"{what} file does not parse ({exc})") from exc


def _text(document: dict, key: str) -> str:
    value = document.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key!r} is missing or not a string")
    return value


ADMISSION_FILE = "admission.json"


def read_admission(root: Path) -> tuple[str, int] | None:
    """The admission state of a member that started empty (see RaftCore.await_admission), or
    None once it was admitted (or never needed to be)."""
    return _read_document(root / ADMISSION_FILE, "admission",
                          lambda document: (_text(document, "state"), int(document["commit"])))


def write_admission(root: Path, state: tuple[str, int] | None, *, fsync: bool = True) -> None:
    """Record the admission state durably; None removes the record."""
    path = root / ADMISSION_FILE
    if state is None:
        path.unlink(missing_ok=True)
        return
    document = {"state": state[0], "commit": state[1]}
    write_atomic(path, json.dumps(document).encode() + b"\n", fsync=fsync)
