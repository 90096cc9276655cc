"""`S3Archive`: the archive in an S3 bucket (AWS or any S3-compatible store), through boto3.

Writes are create-only. Each `put_*` first HEADs the key (so re-uploading a big snapshot after a
crash costs one request, not the whole upload), then writes with `If-None-Match: *` on
PutObject and CompleteMultipartUpload, which S3 (since 2024), MinIO and moto honour: if two
writers race, exactly one creates the object and the other gets 412, HEADs the winner's object
and compares digests. boto3's managed multipart upload cannot pass that header (s3transfer
filters its arguments), so it is added by a botocore `before-parameter-build` hook on this
archive's private client. A store that rejects the header is detected on the first write and
the archive falls back to HEAD-then-PUT, which leaves a window between the HEAD and the PUT in
which a racing writer's object can be overwritten (docs/archive.md lists the stores). A store
that ignores the header silently gives the same, weaker guarantee.

Every object carries `x-amz-meta-sha256`, computed before the upload (a first pass over the
file, from the same open descriptor); every read recomputes it. With `encryption` (sse.py),
every write asks the store to encrypt the object at rest.

Credentials come only from boto3's standard chain (environment, shared config, instance or pod
roles). This module never reads, logs or formats them; endpoints with user info are refused.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from flotilla.node.storage.fsutil import fsync_dir

from .errors import (
    ArchiveConflict,
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
from .sse import S3Encryption

log = logging.getLogger(__name__)

T = TypeVar("T")

# What a response body can fail with after the headers arrived: botocore's retries are over by
# then, so these are retried here (the whole GET again).
_STREAM_ERRORS = (HTTPClientError, IncompleteReadError)
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_DENIED = {
    "AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "AllAccessDisabled", "AccountProblem",
}
_BUSY = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
    "ServiceUnavailable", "RequestLimitExceeded", "OperationAborted",
}
# 409 ConditionalRequestConflict: AWS's answer when two conditional writes race.
_LOST_RACE = {"PreconditionFailed", "ConditionalRequestConflict"}


def _error_fields(exc: ClientError) -> tuple[str, int, str]:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return str(error.get("Code", "")), int(status or 0), str(error.get("Message", ""))


def _rejects_condition(exc: ClientError) -> bool:
    """Whether the store refused the If-None-Match header itself (rather than the write)."""
    code, status, message = _error_fields(exc)
    if status == 501 or code == "NotImplemented":
        return True
    text = message.lower()
    return code in ("InvalidArgument", "InvalidRequest", "InvalidHeader") and (
        "match" in text or "condition" in text
    )


class S3Archive:
    """An `Archive` under `s3://bucket/prefix`."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        region: str | None = None,
        settings: ArchiveSettings | None = None,
        encryption: S3Encryption | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint = endpoint
        self.region = region
        self.settings = settings = settings or ArchiveSettings()
        self.encryption = encryption
        self._encrypt = encryption.put_args() if encryption is not None else {}
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._base = f"{self.prefix}/" if self.prefix else ""
        options: dict[str, Any] = {
            "connect_timeout": settings.connect_timeout,
            "read_timeout": settings.read_timeout,
            "retries": {"mode": "standard", "max_attempts": settings.max_attempts},
        }
        if endpoint:
            # S3-compatible stores rarely have wildcard DNS for virtual-host buckets, and many
            # reject the CRC trailers newer botocore adds by default; our SHA-256 covers
            # integrity end to end anyway.
            options["s3"] = {"addressing_style": "path"}
            options["request_checksum_calculation"] = "when_required"
            options["response_checksum_validation"] = "when_required"
        # A private session: boto3's default session is not thread-safe; clients are.
        session = boto3.session.Session()
        self.client = session.client(
            "s3", endpoint_url=endpoint, region_name=region, config=Config(**options)
        )
        self._transfer = TransferConfig(
            multipart_threshold=settings.multipart_threshold,
            multipart_chunksize=settings.multipart_chunksize,
            max_concurrency=settings.max_concurrency,
            preferred_transfer_client="classic",
        )
        self._conditional = settings.conditional_writes == "auto"
        self._random = random.Random()
        for operation in ("PutObject", "CompleteMultipartUpload"):
            self.client.meta.events.register(
                f"before-parameter-build.s3.{operation}", self._add_create_only_condition
            )

    def __repr__(self) -> str:
        return f"S3Archive({self.url!r}, endpoint={self.endpoint!r}, region={self.region!r})"

    def url_for(self, key: str) -> str:
        return f"{self.url}/{key}"

    def close(self) -> None:
        self.client.close()

    def _add_create_only_condition(self, params: dict[str, Any], **_: Any) -> None:
        if self._conditional:
            params.setdefault("IfNoneMatch", "*")

    # --- writes -------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        digest = hashlib.sha256(data).hexdigest()
        full = self._full(key)

        def upload() -> None:
            if len(data) >= self.settings.multipart_threshold:
                self._upload_stream(io.BytesIO(data), full, digest)
            else:
                self.client.put_object(
                    Bucket=self.bucket, Key=full, Body=data, Metadata={"sha256": digest},
                    ContentType=_content_type(key), **self._encrypt,
                )

        return self._put(key, digest, len(data), upload)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> ObjectInfo:
        full = self._full(key)
        with open(path, "rb") as source:
            digest = sha256_of_file(source)
            size = source.tell()

            def upload() -> None:
                source.seek(0)
                self._upload_stream(source, full, digest)

            return self._put(key, digest, size, upload)

    def _upload_stream(self, source: io.RawIOBase | io.BufferedIOBase, full: str, digest: str):
        # upload_fileobj switches to multipart at the threshold and re-raises the original
        # ClientError (upload_file would wrap it); s3transfer aborts a failed multipart upload.
        self.client.upload_fileobj(
            source, self.bucket, full,
            ExtraArgs={"Metadata": {"sha256": digest}, "ContentType": "application/octet-stream",
                       **self._encrypt},
            Config=self._transfer,
        )

    def _put(self, key: str, digest: str, size: int, upload: Callable[[], None]) -> ObjectInfo:
        existing = self.head(key)
        if existing is not None:
            return self._same_or_conflict(key, digest, existing)
        for _ in range(3):
            try:
                upload()
            except ClientError as exc:
                code, _status, _message = _error_fields(exc)
                if code in _LOST_RACE:
                    existing = self.head(key)
                    if existing is None:
                        continue  # the winner's object was deleted meanwhile: try again
                    return self._same_or_conflict(key, digest, existing)
                if self._conditional and _rejects_condition(exc):
                    self._conditional = False
                    log.warning(
                        "%s rejects conditional writes (If-None-Match: *, %s); falling back to "
                        "HEAD-then-PUT, which cannot stop two racing writers (docs/archive.md)",
                        self.endpoint or "the S3 endpoint", code,
                    )
                    continue
                raise self._translate(exc, "upload", key) from exc
            except BotoCoreError as exc:
                raise self._translate(exc, "upload", key) from exc
            return ObjectInfo(key, size, digest)
        raise ArchiveUnavailable(
            f"could not create {self.url_for(key)}: it kept appearing and disappearing while "
            "being written (another process is writing and deleting it); retry later"
        )

    def _same_or_conflict(self, key: str, digest: str, existing: ObjectInfo) -> ObjectInfo:
        if existing.sha256 != digest:
            found = existing.sha256 or "no recorded SHA-256"
            raise ArchiveConflict(
                f"{self.url_for(key)} already exists with different content ({found}, new "
                f"content {digest}); archived objects are never overwritten: if the existing "
                "object is damaged, delete it by hand (aws s3 rm) and upload again"
            )
        return existing

    # --- reads --------------------------------------------------------------------------------

    def get_bytes(self, key: str, *, expected_sha256: str | None = None) -> bytes:
        def consume(body: Any) -> bytes:
            return body.read()

        recorded, data = self._read_object(key, consume)
        verify_digest(
            self.url_for(key), hashlib.sha256(data).hexdigest(), recorded, expected_sha256
        )
        return data

    def download(
        self, key: str, dest: str | os.PathLike[str], *, expected_sha256: str | None = None
    ) -> ObjectInfo:
        dest = Path(dest)
        temp = temp_path_beside(dest)
        try:
            with open(temp, "xb") as out:

                def consume(body: Any) -> tuple[str, int]:
                    out.seek(0)
                    out.truncate()
                    digest = hashlib.sha256()
                    for chunk in body.iter_chunks(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                    return digest.hexdigest(), out.tell()

                recorded, (actual, size) = self._read_object(key, consume)
                verify_digest(self.url_for(key), actual, recorded, expected_sha256)
                out.flush()
                if self.settings.fsync:
                    os.fsync(out.fileno())
            os.replace(temp, dest)
            if self.settings.fsync:
                fsync_dir(dest.parent)
        finally:
            temp.unlink(missing_ok=True)
        return ObjectInfo(key, size, actual)

    def _read_object(self, key: str, consume: Callable[[Any], T]) -> tuple[str | None, T]:
        """GET `key` and feed its body to `consume`; if the body breaks off mid-stream (which
        botocore does not retry), GET again, a bounded number of times with backoff."""
        full = self._full(key)
        attempts = self.settings.stream_attempts
        delay = self.settings.retry_base_delay
        for attempt in range(1, attempts + 1):
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=full)
            except (ClientError, BotoCoreError) as exc:
                raise self._translate(exc, "read", key) from exc
            body = response["Body"]
            try:
                return response.get("Metadata", {}).get("sha256"), consume(body)
            except _STREAM_ERRORS as exc:
                if attempt == attempts:
                    raise ArchiveUnavailable(
                        f"reading {self.url_for(key)} broke off {attempts} times "
                        f"({type(exc).__name__}); the store or network is unstable, retry later"
                    ) from exc
                log.warning(
                    "reading %s broke off (%s); retrying", self.url_for(key), type(exc).__name__
                )
                time.sleep(delay * self._random.uniform(0.5, 1.5))
                delay *= 2
            finally:
                body.close()
        raise AssertionError("unreachable")

    def head(self, key: str) -> ObjectInfo | None:
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as exc:
            if _error_fields(exc)[0] in _NOT_FOUND:
                return None
            raise self._translate(exc, "inspect", key) from exc
        except BotoCoreError as exc:
            raise self._translate(exc, "inspect", key) from exc
        return ObjectInfo(
            key, int(response["ContentLength"]), response.get("Metadata", {}).get("sha256")
        )

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        skip = len(self._base)
        for page in self._pages(prefix, delimiter=None):
            for item in page.get("Contents", []):
                yield item["Key"][skip:]

    def list_prefixes(self, prefix: str = "") -> list[str]:
        skip = len(self._base) + len(prefix)
        found = []
        for page in self._pages(prefix, delimiter="/"):
            prefixes = page.get("CommonPrefixes", [])
            found.extend(item["Prefix"][skip:].rstrip("/") for item in prefixes)
        return sorted(found)

    def _pages(self, prefix: str, delimiter: str | None) -> Iterator[dict[str, Any]]:
        """ListObjectsV2 pages of at most `settings.page_size` keys, following the
        continuation token."""
        request: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": self._base + prefix,
            "MaxKeys": self.settings.page_size,
        }
        if delimiter:
            request["Delimiter"] = delimiter
        while True:
            try:
                page = self.client.list_objects_v2(**request)
            except (ClientError, BotoCoreError) as exc:
                raise self._translate(exc, "list", prefix or "(root)") from exc
            yield page
            if not page.get("IsTruncated"):
                return
            request["ContinuationToken"] = page["NextContinuationToken"]

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as exc:
            if _error_fields(exc)[0] in _NOT_FOUND:
                return
            raise self._translate(exc, "delete", key) from exc
        except BotoCoreError as exc:
            raise self._translate(exc, "delete", key) from exc

    # --- helpers ------------------------------------------------------------------------------

    def _full(self, key: str) -> str:
        return self._base + check_key(key)

    def _translate(self, exc: BaseException, action: str, key: str) -> ArchiveError:
        """One of our errors for a boto3 failure, saying what to do. botocore's messages name
        the operation and the URL but never credentials, so they are safe to include."""
        where = self.url_for(key)
        store = self.endpoint or "S3"
        if isinstance(exc, ClientError):
            code, status, message = _error_fields(exc)
            if code == "NoSuchBucket":
                return ArchiveError(
                    f"cannot {action} {where}: bucket {self.bucket!r} does not exist at {store}; "
                    "create it, or fix the --archive URL or --s3-endpoint"
                )
            if code in _NOT_FOUND:
                return ArchiveNotFound(
                    f"{where} does not exist (was it removed by retention, or is the archive URL "
                    "wrong?)"
                )
            if code in _DENIED:
                return ArchiveError(
                    f"cannot {action} {where}: {store} denied access ({code}); check the AWS "
                    "credentials the node runs with (AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the pod's role) and the bucket policy"
                )
            if status >= 500 or code in _BUSY:
                return ArchiveUnavailable(
                    f"cannot {action} {where}: {store} answered {status} {code} after "
                    f"{self.settings.max_attempts} attempts; retry later"
                )
            return ArchiveError(f"cannot {action} {where}: {status} {code}: {message}")
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            return ArchiveError(
                f"cannot {action} {where}: no usable AWS credentials were found; set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for the node"
            )
        if isinstance(exc, BotoConnectionError | HTTPClientError | IncompleteReadError):
            return ArchiveUnavailable(
                f"cannot {action} {where}: {store} is unreachable after "
                f"{self.settings.max_attempts} attempts ({exc}); check that it is up and that "
                "--s3-endpoint is right, then retry"
            )
        return ArchiveError(f"cannot {action} {where}: {exc}")


def _content_type(key: str) -> str:
    return "application/json" if key.endswith(".json") else "application/octet-stream"
