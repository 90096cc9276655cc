"""S3 server-side encryption of what the archive writes (`--s3-sse`, `--s3-sse-kms-key-id`).

The store encrypts each object at rest and decrypts it for any reader allowed to read it (and,
for `aws:kms`, to use the key), so only writes carry the options: every PutObject and every
multipart upload's CreateMultipartUpload. Without them the bucket's default encryption applies.
`file://` archives ignore them (use an encrypted file system).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MODES = ("AES256", "aws:kms")


@dataclass(frozen=True, slots=True)
class S3Encryption:
    mode: str  # ServerSideEncryption: AES256 (S3-managed keys) or aws:kms
    kms_key_id: str | None = None  # SSEKMSKeyId (aws:kms only; None: the account's S3 key)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--s3-sse must be {' or '.join(MODES)}, not {self.mode!r}")
        if self.kms_key_id is not None and self.mode != "aws:kms":
            raise ValueError("--s3-sse-kms-key-id goes with --s3-sse aws:kms")
        if self.kms_key_id == "":
            raise ValueError("--s3-sse-kms-key-id is empty: give a KMS key id, ARN or alias")

    @classmethod
    def parse(cls, mode: str | None, kms_key_id: str | None) -> S3Encryption | None:
        """The options of the two flags (None: neither given). ValueError, one line, for a
        bad mode or a KMS key without `aws:kms`."""
        if mode is None:
            if kms_key_id is not None:
                raise ValueError("--s3-sse-kms-key-id goes with --s3-sse aws:kms")
            return None
        return cls(mode, kms_key_id)

    def put_args(self) -> dict[str, Any]:
        """The arguments of PutObject (and of boto3's managed upload, which passes them on to
        CreateMultipartUpload)."""
        args: dict[str, Any] = {"ServerSideEncryption": self.mode}
        if self.kms_key_id is not None:
            args["SSEKMSKeyId"] = self.kms_key_id
        return args
