"""Archive URLs (`s3://bucket/prefix`, `file:///abs/path`) and `open_archive`, which picks the
backend for one. `parse_archive_url` raises ValueError with a one-line reason, so flag parsing
can reject a bad `--archive` or `--restore-from` before anything starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .protocol import Archive, ArchiveSettings
from .sse import S3Encryption


@dataclass(frozen=True, slots=True)
class ArchiveURL:
    scheme: str  # "s3" or "file"
    location: str  # the bucket, or the absolute root directory
    prefix: str = ""  # S3 only: the key prefix inside the bucket, without slashes at the ends


def parse_archive_url(url: str) -> ArchiveURL:
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError("archive URL must not have a query (?...) or fragment (#...)")
    if "@" in parts.netloc:
        # Never echo it: the part before '@' may be a secret.
        raise ValueError(
            "archive URL must not carry credentials; boto3 takes them from the environment "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or AWS_PROFILE"
        )
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"archive URL {url!r} names no bucket: use s3://bucket/prefix")
        return ArchiveURL("s3", parts.netloc, parts.path.strip("/"))
    if parts.scheme == "file":
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            raise ValueError(
                f"archive URL {url!r} is not an absolute file URL: use file:///absolute/path"
            )
        return ArchiveURL("file", path.rstrip("/") or "/")
    raise ValueError(
        f"archive URL {url!r} is not supported: use s3://bucket/prefix or file:///absolute/path"
    )


def normalize_archive_url(text: str) -> str:
    """An archive URL as members and jobs need it: ``s3://...`` or an absolute ``file://`` URL.
    A plain path (relative ones included) is taken as a local directory and made absolute
    here, where it was typed. ValueError says what is wrong with anything else."""
    if "://" not in text:
        text = Path(text).resolve().as_uri()
    parse_archive_url(text)
    return text


def open_archive(
    url: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    settings: ArchiveSettings | None = None,
    encryption: S3Encryption | None = None,
) -> Archive:
    """The archive at `url`. `endpoint`, `region` (for S3-compatible stores) and `encryption`
    (server-side, of what it writes) only matter for s3:// URLs. Raises ValueError for a
    malformed URL or endpoint."""
    parsed = parse_archive_url(url)
    if parsed.scheme == "file":
        from .filesystem import FileArchive

        return FileArchive(parsed.location, settings)
    if endpoint is not None:
        endpoint_parts = urlsplit(endpoint)
        if endpoint_parts.scheme not in ("http", "https") or not endpoint_parts.netloc:
            raise ValueError("S3 endpoint must be an http:// or https:// URL")
        if "@" in endpoint_parts.netloc:
            raise ValueError(
                "S3 endpoint must not carry credentials; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY in the environment instead"
            )
    from .s3 import S3Archive  # boto3 is slow to import: only when an S3 archive is used

    return S3Archive(
        parsed.location, parsed.prefix, endpoint=endpoint, region=region, settings=settings,
        encryption=encryption,
    )
