"""`FileArchive`: the archive on a local (or mounted) file system, for `file:///path` URLs.

Same keys as S3, as paths under the root. A write goes to a hidden temporary file in the target
directory, is fsynced, and is then hard-linked to its final name: `link()` fails if the name
exists, so the first writer wins and no object is ever overwritten (the file-system form of
S3's `If-None-Match: *`). The directory is fsynced after the link. Objects are 0600 and the
directories made for them 0700: the archive holds every value the cluster ever stored.

Each object's SHA-256 sits beside it in `<name>.sha256`, in `sha256sum` format, so that
`cd snapshots && sha256sum -c *.sha256` checks an archive by hand. The sidecar is written after
the object is linked, so a crash in between leaves an object without one. That object cannot be
verified on its own; a reader holding a manifest digest still can, and a retried `put` of the
same bytes writes the missing sidecar.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from flotilla.node.storage.fsutil import FILE_MODE, ensure_dir, fsync_dir, write_all

from .errors import (
    ArchiveConflict,
    ArchiveCorrupt,
    ArchiveError,
    ArchiveNotFound,
    ArchiveUnavailable,
)
from .protocol import (
    CHUNK,
    ArchiveSettings,
    ObjectInfo,
    check_key,
    sha256_of_file,
    temp_path_beside,
    verify_digest,
)

log = logging.getLogger(__name__)

SIDECAR_SUFFIX = ".sha256"
_SIDECAR_LINE = re.compile(r"^([0-9a-f]{64})  (.+)\n?$")


def _os_error(exc: OSError, what: str) -> ArchiveError:
    if isinstance(exc, PermissionError):
        return ArchiveError(f"{what}: permission denied ({exc.strerror}); check the owner and "
                            "mode of the archive directory")
    return ArchiveUnavailable(f"{what}: {exc.strerror or exc} (errno {exc.errno}); check that "
                              "the archive file system is mounted, writable and not full")


class FileArchive:
    """An `Archive` rooted at a directory (created on the first write)."""

    def __init__(self, root: str | os.PathLike[str], settings: ArchiveSettings | None = None):
        self.root = Path(root)
        if not self.root.is_absolute():
            raise ValueError(f"file archive root must be an absolute path, got {root!s}")
        self.settings = settings or ArchiveSettings()
        self.url = "file://" + quote(str(self.root))

    def __repr__(self) -> str:
        return f"FileArchive({self.url!r})"

    def url_for(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{key}"

    def close(self) -> None:
        pass

    # --- writes -------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        digest = hashlib.sha256(data).hexdigest()

        def fill(fd: int) -> None:
            write_all(fd, data)

        return self._put(key, digest, len(data), fill)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> ObjectInfo:
        with open(path, "rb") as source:
            # Open once: a snapshot file may be replaced (unlinked) while it is being shipped,
            # and the open descriptor keeps reading the same bytes.
            digest = sha256_of_file(source)
            size = source.tell()

            def fill(fd: int) -> None:
                source.seek(0)
                with os.fdopen(os.dup(fd), "wb", closefd=True) as out:
                    shutil.copyfileobj(source, out, CHUNK)

            return self._put(key, digest, size, fill)

    def _put(self, key: str, digest: str, size: int, fill) -> ObjectInfo:
        target = self._path(key)
        where = self.url_for(key)
        existing = self._existing_digest(target, where)
        if existing is not None:
            return self._same_or_conflict(key, target, digest, existing)
        fsync = self.settings.fsync
        temp = temp_path_beside(target)
        try:
            ensure_dir(target.parent, fsync=fsync)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            try:
                fill(fd)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            linked = self._link(temp, target, where)
        except OSError as exc:
            raise _os_error(exc, f"cannot write {where}") from exc
        finally:
            temp.unlink(missing_ok=True)
        if not linked:
            # Another writer created it between our check and our link: compare with theirs.
            existing = self._existing_digest(target, where)
            return self._same_or_conflict(key, target, digest, existing or "")
        self._write_sidecar(target, digest)
        return ObjectInfo(key, size, digest)

    def _link(self, temp: Path, target: Path, where: str) -> bool:
        """Give the finished temporary file its final name unless that name exists."""
        try:
            os.link(temp, target)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise ArchiveError(
                    f"cannot create {where}: this file system does not support hard links, "
                    "which the archive needs to write without overwriting; put the archive on "
                    "a local POSIX file system (ext4, xfs, tmpfs)"
                ) from exc
            raise
        return True  # the directory is fsynced once the sidecar is in place too

    def _same_or_conflict(self, key: str, target: Path, digest: str, existing: str) -> ObjectInfo:
        if existing != digest:
            raise ArchiveConflict(
                f"{self.url_for(key)} already exists with different content (SHA-256 "
                f"{existing}, new content {digest}); archived objects are never overwritten: "
                "if the existing object is damaged, delete it by hand and upload again"
            )
        if not self._sidecar(target).exists():
            self._write_sidecar(target, digest)  # heal what a crash after the link left
        return ObjectInfo(key, target.stat().st_size, digest)

    def _existing_digest(self, target: Path, where: str) -> str | None:
        """The digest of the object at `target` (from its sidecar, else by reading it), or None
        if there is no object."""
        try:
            recorded = self._read_sidecar(target, where)
            if recorded is not None and target.exists():
                return recorded
            with open(target, "rb") as file:
                return sha256_of_file(file)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _os_error(exc, f"cannot read {where}") from exc

    def _write_sidecar(self, target: Path, digest: str) -> None:
        sidecar = self._sidecar(target)
        temp = temp_path_beside(sidecar)
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            try:
                write_all(fd, f"{digest}  {target.name}\n".encode())
                if self.settings.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            # Only the writer whose link won (or a put that verified the bytes) gets here, so
            # replacing a stale sidecar (left by a delete interrupted halfway) is safe.
            os.replace(temp, sidecar)
            if self.settings.fsync:
                fsync_dir(target.parent)
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise _os_error(exc, f"cannot write the checksum of {target}") from exc

    # --- reads --------------------------------------------------------------------------------

    def get_bytes(self, key: str, *, expected_sha256: str | None = None) -> bytes:
        target = self._path(key)
        where = self.url_for(key)
        try:
            data = target.read_bytes()
        except FileNotFoundError:
            raise self._not_found(key) from None
        except OSError as exc:
            raise _os_error(exc, f"cannot read {where}") from exc
        recorded = self._read_sidecar(target, where)
        verify_digest(where, hashlib.sha256(data).hexdigest(), recorded, expected_sha256)
        return data

    def download(
        self, key: str, dest: str | os.PathLike[str], *, expected_sha256: str | None = None
    ) -> ObjectInfo:
        target = self._path(key)
        where = self.url_for(key)
        dest = Path(dest)
        temp = temp_path_beside(dest)
        try:
            with open(target, "rb") as source:
                recorded = self._read_sidecar(target, where)
                digest = hashlib.sha256()
                size = 0
                with open(temp, "xb") as out:
                    while chunk := source.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
                    out.flush()
                    verify_digest(where, digest.hexdigest(), recorded, expected_sha256)
                    if self.settings.fsync:
                        os.fsync(out.fileno())
            os.replace(temp, dest)
            if self.settings.fsync:
                fsync_dir(dest.parent)
        except FileNotFoundError as exc:
            temp.unlink(missing_ok=True)
            if exc.filename == str(target):
                raise self._not_found(key) from None
            raise
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise _os_error(exc, f"cannot copy {where} to {dest}") from exc
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return ObjectInfo(key, size, digest.hexdigest())

    def head(self, key: str) -> ObjectInfo | None:
        target = self._path(key)
        try:
            size = target.stat().st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _os_error(exc, f"cannot stat {self.url_for(key)}") from exc
        return ObjectInfo(key, size, self._read_sidecar(target, self.url_for(key)))

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        # Walk only the directory the prefix pins down, then filter by the string prefix, so
        # that "segments/0000" and "segments/" behave as they do on S3.
        directory, _, _ = prefix.rpartition("/")
        start = self.root / directory if directory else self.root
        found = []
        try:
            for dirpath, dirnames, filenames in os.walk(start):
                dirnames[:] = [name for name in dirnames if not name.startswith(".")]
                base = Path(dirpath).relative_to(self.root).as_posix()
                for name in filenames:
                    if name.startswith(".") or name.endswith(SIDECAR_SUFFIX):
                        continue
                    key = name if base == "." else f"{base}/{name}"
                    if key.startswith(prefix):
                        found.append(key)
        except OSError as exc:
            raise _os_error(exc, f"cannot list {self.url_for(prefix)}") from exc
        return iter(sorted(found))

    def list_prefixes(self, prefix: str = "") -> list[str]:
        directory = self.root / prefix if prefix else self.root
        try:
            return sorted(
                entry.name
                for entry in os.scandir(directory)
                if entry.is_dir() and not entry.name.startswith(".")
            )
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _os_error(exc, f"cannot list {self.url_for(prefix)}") from exc

    def delete(self, key: str) -> None:
        target = self._path(key)
        try:
            target.unlink(missing_ok=True)
            self._sidecar(target).unlink(missing_ok=True)
            if self.settings.fsync and target.parent.exists():
                fsync_dir(target.parent)
        except OSError as exc:
            raise _os_error(exc, f"cannot delete {self.url_for(key)}") from exc

    # --- helpers ------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    @staticmethod
    def _sidecar(target: Path) -> Path:
        return target.with_name(target.name + SIDECAR_SUFFIX)

    def _read_sidecar(self, target: Path, where: str) -> str | None:
        try:
            line = self._sidecar(target).read_text()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise ArchiveError(f"cannot read the checksum sidecar of {where}: {exc}") from exc
        match = _SIDECAR_LINE.match(line)
        if match is None or match.group(2) != target.name:
            raise ArchiveCorrupt(
                f"the checksum sidecar of {where} is damaged (expected '<sha256>  "
                f"{target.name}'); verify the object by other means, then rewrite the sidecar",
                key=where,
            )
        return match.group(1)

    def _not_found(self, key: str) -> ArchiveNotFound:
        return ArchiveNotFound(
            f"{self.url_for(key)} does not exist (was it removed by retention, or is the "
            "archive URL wrong?)"
        )
