"""Manifest MACs: an HMAC-SHA256 over each manifest, keyed by a secret the cluster's writers and
readers share, so that someone who can write to the bucket but does not hold the key cannot
rewrite what the archive holds.

A manifest lists every object with its SHA-256, so a MAC over the manifest covers the objects
too: a rewritten object needs a rewritten digest in the manifest, which needs the key.

What is MACed is the manifest's *canonical content*: its JSON document without the `mac` field,
serialized with sorted keys, no whitespace and ASCII escapes, after a domain tag. The cluster
id and the seq are part of it, so a signed manifest cannot be copied to another cluster's
prefix or to another seq (the reader checks both against where it read it from). The result
sits in the document itself:

    "mac": {"alg": "HMAC-SHA256", "key_id": "k-3f6a0c1d9b2e4f70", "value": "<64 hex digits>"}

`key_id` names the key without revealing it (an HMAC of a fixed string under the key), so a
reader holding several keys (a rotation: the new key first, the old ones after it) picks the
one that signed. Readers with keys refuse a manifest whose MAC is missing, names a key they do
not hold, or does not verify (`ManifestNotAuthentic`); readers without keys ignore the field,
as do builds older than it. What a MAC cannot stop: deleting the newest manifests, which rolls
the archive back to an older signed state (docs/archive.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ArchiveCorrupt

MIN_KEY_BYTES = 16
ALGORITHM = "HMAC-SHA256"
FIELD = "mac"
_DOMAIN = b"flotilla-archive-manifest-mac-v1\n"
_KEY_ID_LABEL = b"flotilla-archive-key-id-v1"


class ManifestNotAuthentic(ArchiveCorrupt):
    """A manifest a reader holding signing keys will not trust: no MAC, a MAC by a key it does
    not hold, or a MAC that does not verify. Never worked around by reading an older manifest:
    the archive may have been tampered with."""


@dataclass(frozen=True, slots=True)
class SigningKey:
    secret: bytes = field(repr=False)
    key_id: str

    @classmethod
    def from_secret(cls, secret: bytes, *, source: str = "the signing key") -> SigningKey:
        if len(secret) < MIN_KEY_BYTES:
            raise ValueError(f"{source} holds {len(secret)} bytes; a manifest signing key "
                             f"needs at least {MIN_KEY_BYTES} (e.g. `head -c 32 /dev/urandom`)")
        digest = hmac.new(secret, _KEY_ID_LABEL, hashlib.sha256).hexdigest()
        return cls(secret, f"k-{digest[:16]}")


def read_key_file(path: str | os.PathLike[str]) -> SigningKey:
    """The key in file `path`: its bytes, without trailing line breaks (a Secret written with
    `echo` keeps working). ValueError, naming the file, when it cannot be read or is short."""
    try:
        with open(path, "rb") as file:
            secret = file.read().rstrip(b"\r\n")
    except OSError as exc:
        raise ValueError(f"cannot read the signing key file {path}: "
                         f"{exc.strerror or exc}") from None
    return SigningKey.from_secret(secret, source=f"the signing key file {path}")


@dataclass(frozen=True, slots=True)
class ManifestKeys:
    """The keys of an archive's manifests: the first signs what is written, any of them
    verifies what is read."""

    keys: tuple[SigningKey, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("ManifestKeys needs at least one key")

    @classmethod
    def from_files(cls, paths: Iterable[str | os.PathLike[str]]) -> ManifestKeys:
        return cls(tuple(read_key_file(path) for path in paths))

    @classmethod
    def parse(cls, text: str) -> ManifestKeys:
        """`--archive-signing-key-file F[,F...]`: ValueError with a one-line reason."""
        paths = [part.strip() for part in text.split(",")]
        if not all(paths):
            raise ValueError(f"expected FILE or FILE,FILE,... (the first signs), not {text!r}")
        return cls.from_files(paths)

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(key.key_id for key in self.keys)

    def sign(self, document: Mapping[str, Any]) -> dict[str, str]:
        """The `mac` field for `document` (which must not hold one), under the first key."""
        key = self.keys[0]
        return {"alg": ALGORITHM, "key_id": key.key_id, "value": _mac(key, document)}

    def verify(self, document: Mapping[str, Any], name: str) -> None:
        """Raise ManifestNotAuthentic unless `document` carries a MAC, by one of these keys,
        that verifies. `name` (the manifest's URL) goes in the message."""
        found = document.get(FIELD)
        held = ", ".join(self.key_ids)
        if not isinstance(found, dict):
            raise ManifestNotAuthentic(
                f"{name} carries no MAC, but manifests are verified with a signing key "
                f"({held}): it was written without the key, or someone removed the MAC. If "
                "this archive was written before signing was turned on, read it without "
                "--archive-signing-key-file (after checking it); otherwise do not use it: "
                "restore from a copy you trust", key=name)
        key_id = found.get("key_id")
        key = next((k for k in self.keys if k.key_id == key_id), None)
        if found.get("alg") != ALGORITHM or key is None:
            raise ManifestNotAuthentic(
                f"{name} is signed with {found.get('alg')!r} key {key_id!r}, which is not "
                f"among the signing keys given ({held}): pass the key it was signed with too "
                "(after a rotation, list the old key files after the new one)", key=name)
        value = found.get("value")
        if not isinstance(value, str) or not hmac.compare_digest(
                value.encode("utf-8", "surrogatepass"), _mac(key, document).encode()):
            raise ManifestNotAuthentic(
                f"{name} does not verify with signing key {key.key_id}: it was changed after "
                "it was signed, by someone without the key (or its bytes are damaged). Do not "
                "use this archive: find out who can write to it, and restore from a copy you "
                "trust", key=name)


def _mac(key: SigningKey, document: Mapping[str, Any]) -> str:
    content = {name: value for name, value in document.items() if name != FIELD}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac.new(key.secret, _DOMAIN + canonical.encode(), hashlib.sha256).hexdigest()
