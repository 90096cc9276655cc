"""`flotilla node` flags, with `FLOTILLA_<FLAG>` environment fallbacks (a flag beats env).

Every mistake is reported as one line that names the flag and what would be right; the CLI
exits 2 on it.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from flotilla.node.alarms import DEFAULT_QUOTA_FREE_BYTES
from flotilla.node.archive.signing import ManifestKeys
from flotilla.node.archive.sse import S3Encryption
from flotilla.node.archive.timeindex import parse_time
from flotilla.node.archive.urls import parse_archive_url
from flotilla.node.snapshot_policy import SnapshotPolicy, parse_size
from flotilla.node.statemachine.protocol import StateMachineLoadError, load_state_machine

from flotilla.logs import LogSettingError, parse_format, parse_level

DEFAULT_MAX_VALUE_BYTES = 1 << 20
#: The shortest admin token a member accepts (etcd-grade secrets are 32 random bytes).
MIN_TOKEN_BYTES = 16
#: How to make a token by hand, as Flotilla makes its own (new_admin_token).
TOKEN_RECIPE = "python3 -c 'import secrets; print(secrets.token_hex(32))'"


def new_admin_token() -> str:
    """An admin token as a member's first start, `flotilla up` and the operator generate it:
    256 random bits in 64 hex digits. Safe on a command line: a URL-safe base64 token starts
    with '-' one time in 64, and `--token TOKEN` then reads it as a flag."""
    return secrets.token_hex(32)
#: Member names: what a DNS label, a path segment and `--initial-cluster` all accept.
MEMBER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
NAME_RULE = "1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit"


class UsageError(ValueError):
    """A bad flag: the message is the one line the user sees."""


@dataclass(frozen=True)
class NodeConfig:
    name: str
    data_dir: str
    listen_peer: tuple[str, int]
    listen_client: tuple[str, int]
    advertise_peer: str
    advertise_client: str
    initial_cluster: dict[str, str] = field(default_factory=dict)
    initial_cluster_state: str = "new"
    cluster_id: str = "flotilla"
    election_timeout_ms: int = 1000
    heartbeat_ms: int = 100
    snapshot_policy: SnapshotPolicy = field(default_factory=SnapshotPolicy.default)
    quota_free_bytes: int = DEFAULT_QUOTA_FREE_BYTES
    archive: str | None = None
    archive_keep_snapshots: int = 3
    archive_interval_ms: int = 5000
    archive_segment_entries: int = 10000
    s3_endpoint: str | None = None
    s3_region: str | None = None
    # Archive protection: manifest MACs (first key signs, all verify) and S3 encryption at rest.
    archive_keys: ManifestKeys | None = None
    s3_encryption: S3Encryption | None = None
    restore_from: str | None = None
    restore_cluster_id: str | None = None
    restore_index: int | None = None
    restore_time: int | None = None  # ms since the epoch (`--restore-time`, parsed)
    admin_token: str | None = None
    # TLS (etcd's flag names): the client/admin port, and mutual TLS on the peer port.
    cert_file: str | None = None
    key_file: str | None = None
    trusted_ca_file: str | None = None
    client_cert_auth: bool = False
    peer_cert_file: str | None = None
    peer_key_file: str | None = None
    peer_trusted_ca_file: str | None = None
    fsync: bool = True
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    # The replicated state machine: `module:Class`, or `kv` for the built-in key-value machine.
    state_machine: str = "kv"
    log_format: str = "text"  # or json: one object per line (flotilla/logs.py)
    log_level: str = "info"

    @property
    def election_ticks(self) -> int:
        return max(2, self.election_timeout_ms // self.heartbeat_ms)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own convention)
        raise UsageError(message)


FLAGS: list[tuple[str, dict]] = [
    ("--name", {"help": "member name, unique in its cluster (required)"}),
    ("--data-dir", {"help": "log, hard state and snapshots (required)"}),
    ("--listen-peer", {"help": "HOST:PORT for Raft peer traffic (required)"}),
    ("--listen-client", {"help": "HOST:PORT for the client and admin HTTP API (required)"}),
    ("--advertise-peer", {"help": "peer URL others dial (default: from --listen-peer)"}),
    ("--advertise-client", {"help": "client URL others dial (default: from --listen-client)"}),
    ("--initial-cluster", {"help": "N1=URL,N2=URL: peer URLs of the first voters"}),
    ("--initial-cluster-state", {"help": "new (bootstrap as a voter) or existing (wait to be "
                                         "added as a learner)", "default": None}),
    ("--cluster-id", {"help": "shared by all members; requests carrying another are refused"}),
    ("--election-timeout-ms", {"help": "election timeout (default 1000)"}),
    ("--heartbeat-ms", {"help": "heartbeat interval (default 100)"}),
    ("--snapshot-policy", {"help": "ratio=0.1, log-bytes=64MiB, entries=10000, combinable"}),
    ("--quota-free-bytes", {"help": "below this much free space on the data dir's file system "
                                    "(e.g. 64MiB, the default; 0: never) the NOSPACE alarm "
                                    "refuses client writes with 507"}),
    ("--archive", {"help": "s3://bucket/prefix or file:///path"}),
    ("--s3-endpoint", {"help": "S3-compatible endpoint URL"}),
    ("--s3-region", {"help": "S3 region"}),
    ("--archive-keep-snapshots", {"help": "archived snapshots kept, with the segments after "
                                          "the oldest of them (default 3)"}),
    ("--archive-interval-ms", {"help": "committed entries are shipped at least this often "
                                       "(default 5000)"}),
    ("--archive-segment-entries", {"help": "entries per archived segment at most (default "
                                           "10000); a full one ships at once"}),
    # Archive protection (docs/archive.md#signed-manifests, #server-side-encryption).
    ("--archive-signing-key-file", {"help": "FILE[,FILE...]: sign every archive manifest with "
                                            "the key in the first file (16 bytes at least); "
                                            "manifests read must verify with one of them"}),
    ("--s3-sse", {"help": "AES256 or aws:kms: S3 server-side encryption of what is archived"}),
    ("--s3-sse-kms-key-id", {"help": "with --s3-sse aws:kms: the KMS key (id, ARN or alias)"}),
    ("--restore-from", {"help": "bootstrap a new cluster from this archive URL"}),
    ("--restore-cluster-id", {"help": "which cluster of that archive"}),
    ("--restore-index", {"help": "restore exactly the state at this index"}),
    ("--restore-time", {"help": "restore the state after the last entry stamped at or before "
                                "this RFC 3339 time (e.g. 2026-11-25T17:00:00.250Z)"}),
    ("--admin-token", {"help": "admin endpoints require Authorization: Bearer TOKEN"}),
    ("--cert-file", {"help": "TLS certificate (PEM) for the client/admin port"}),
    ("--key-file", {"help": "the private key (PEM) of --cert-file"}),
    ("--trusted-ca-file", {"help": "CA (PEM) that signs client certificates "
                                   "(with --client-cert-auth)"}),
    ("--client-cert-auth", {"help": "clients must present a certificate signed by "
                                    "--trusted-ca-file", "nargs": "?", "const": "true"}),
    ("--peer-cert-file", {"help": "this member's certificate (PEM) for mutual TLS on the peer "
                                  "port; its CN or a DNS SAN must equal --name"}),
    ("--peer-key-file", {"help": "the private key (PEM) of --peer-cert-file"}),
    ("--peer-trusted-ca-file", {"help": "the cluster's CA (PEM): peers must present a "
                                        "certificate it signed"}),
    ("--fsync", {"help": "true (default) or false: acknowledge only what is on disk"}),
    ("--max-value-bytes", {"help": "largest value a client may write (default 1 MiB)"}),
    ("--state-machine", {"help": "the replicated state machine, module:Class (importable: "
                                 "installed or on PYTHONPATH); default kv, the built-in "
                                 "key-value machine"}),
    ("--log-format", {"help": "text (default) or json: logs on stderr, json as one object "
                              "per line"}),
    ("--log-level", {"help": "debug, info (default), warning or error"}),
]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flotilla node", description="Run one Flotilla cluster member.")
    for flag, options in FLAGS:
        parser.add_argument(flag, **options)
    return parser


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> NodeConfig:
    env = os.environ if env is None else env
    raw = vars(build_parser().parse_args(list(argv)))
    for flag, _ in FLAGS:
        key = flag[2:].replace("-", "_")
        if raw.get(key) is None:
            raw[key] = env.get("FLOTILLA_" + key.upper()) or None
    for required in ("name", "data_dir", "listen_peer", "listen_client"):
        if not raw[required]:
            flag = "--" + required.replace("_", "-")
            raise UsageError(f"{flag} is required (or set FLOTILLA_{required.upper()})")
    if not MEMBER_NAME.fullmatch(raw["name"]):
        raise UsageError(f"--name must be {NAME_RULE}, not {raw['name']!r}")
    listen_peer = _host_port(raw["listen_peer"], "--listen-peer")
    listen_client = _host_port(raw["listen_client"], "--listen-client")
    tls = _tls(raw)
    peer_scheme = "https" if tls["peer_cert_file"] else "http"
    client_scheme = "https" if tls["cert_file"] else "http"
    advertise_peer = raw["advertise_peer"] or f"{peer_scheme}://{_url_host(listen_peer)}"
    advertise_client = raw["advertise_client"] or f"{client_scheme}://{_url_host(listen_client)}"
    for url, flag in ((advertise_peer, "--advertise-peer"),
                      (advertise_client, "--advertise-client")):
        _check_url(url, flag)
    state = raw["initial_cluster_state"] or "new"
    if state not in ("new", "existing"):
        raise UsageError(f"--initial-cluster-state must be new or existing, not {state!r}")
    initial = _initial_cluster(raw["initial_cluster"])
    if state == "new" and not initial:
        initial = {raw["name"]: advertise_peer}  # a single-member cluster
    if state == "new" and initial and raw["name"] not in initial:
        raise UsageError(f"--initial-cluster must include this member ({raw['name']}) when "
                         "--initial-cluster-state is new")
    for member, url in initial.items() if peer_scheme == "https" else ():
        if not url.startswith("https://"):
            raise UsageError(f"--initial-cluster gives {member} the peer URL {url}, but the peer "
                             "port speaks TLS (--peer-cert-file): use https:// URLs")
    token = raw["admin_token"]
    if token is not None and len(token.encode("utf-8", "surrogateescape")) < MIN_TOKEN_BYTES:
        raise UsageError(f"--admin-token must be at least {MIN_TOKEN_BYTES} bytes long; make "
                         f"one with: {TOKEN_RECIPE}")
    election = _positive_int(raw["election_timeout_ms"], "--election-timeout-ms", 1000)
    heartbeat = _positive_int(raw["heartbeat_ms"], "--heartbeat-ms", 100)
    if election < 2 * heartbeat:
        raise UsageError(f"--election-timeout-ms ({election}) must be at least twice "
                         f"--heartbeat-ms ({heartbeat}); 10x is usual")
    try:
        text = raw["snapshot_policy"]
        policy = SnapshotPolicy.parse(text) if text else SnapshotPolicy.default()
    except ValueError as exc:
        raise UsageError(f"--snapshot-policy: {exc}") from exc
    quota = DEFAULT_QUOTA_FREE_BYTES
    if raw["quota_free_bytes"] is not None:
        try:
            quota = parse_size(raw["quota_free_bytes"])
        except ValueError as exc:
            raise UsageError(f"--quota-free-bytes: {exc}") from None
    for flag in ("archive", "restore_from"):
        if raw[flag]:
            try:
                parse_archive_url(raw[flag])
            except ValueError as exc:
                raise UsageError(f"--{flag.replace('_', '-')}: {exc}") from exc
    if raw["s3_endpoint"]:
        _check_url(raw["s3_endpoint"], "--s3-endpoint")
        if "@" in urlsplit(raw["s3_endpoint"]).netloc:
            raise UsageError("--s3-endpoint must not carry credentials; set AWS_ACCESS_KEY_ID "
                             "and AWS_SECRET_ACCESS_KEY in the environment instead")
    restore_index = raw["restore_index"]
    if restore_index is not None:
        restore_index = _positive_int(restore_index, "--restore-index", 1)
    restore_time = _restore_time(raw["restore_time"], raw["restore_from"], restore_index)
    state_machine = _state_machine(raw["state_machine"])
    try:
        log_format, log_level = parse_format(raw["log_format"]), parse_level(raw["log_level"])
    except LogSettingError as exc:
        raise UsageError(str(exc)) from None
    return NodeConfig(
        name=raw["name"],
        data_dir=raw["data_dir"],
        listen_peer=listen_peer,
        listen_client=listen_client,
        advertise_peer=advertise_peer.rstrip("/"),
        advertise_client=advertise_client.rstrip("/"),
        initial_cluster=initial,
        initial_cluster_state=state,
        cluster_id=raw["cluster_id"] or "flotilla",
        election_timeout_ms=election,
        heartbeat_ms=heartbeat,
        snapshot_policy=policy,
        quota_free_bytes=quota,
        archive=raw["archive"],
        archive_keep_snapshots=_positive_int(raw["archive_keep_snapshots"],
                                             "--archive-keep-snapshots", 3),
        archive_interval_ms=_positive_int(raw["archive_interval_ms"], "--archive-interval-ms",
                                          5000),
        archive_segment_entries=_positive_int(raw["archive_segment_entries"],
                                              "--archive-segment-entries", 10000),
        s3_endpoint=raw["s3_endpoint"],
        s3_region=raw["s3_region"],
        **_archive_protection(raw),
        restore_from=raw["restore_from"],
        restore_cluster_id=raw["restore_cluster_id"],
        restore_index=restore_index,
        restore_time=restore_time,
        admin_token=token,
        **tls,
        fsync=_bool(raw["fsync"], "--fsync"),
        max_value_bytes=_positive_int(raw["max_value_bytes"], "--max-value-bytes",
                                      DEFAULT_MAX_VALUE_BYTES),
        state_machine=state_machine,
        log_format=log_format,
        log_level=log_level,
    )


def _state_machine(spec: str | None) -> str:
    """The `--state-machine` spec, loaded once to check it (its module imported, the class
    made): a spec that cannot work is a usage error, on one line."""
    spec = (spec or "kv").strip()
    try:
        load_state_machine(spec)
    except StateMachineLoadError as exc:
        raise UsageError("--state-machine: " + " ".join(str(exc).split())) from None
    return spec


def _tls(raw: dict) -> dict:
    """The TLS flags, checked for what belongs together (the files are read at start)."""
    tls = {key: raw[key] for key in ("cert_file", "key_file", "trusted_ca_file",
                                     "peer_cert_file", "peer_key_file", "peer_trusted_ca_file")}
    tls["client_cert_auth"] = _bool(raw["client_cert_auth"], "--client-cert-auth") \
        if raw["client_cert_auth"] is not None else False
    if bool(tls["cert_file"]) != bool(tls["key_file"]):
        raise UsageError("--cert-file and --key-file go together: give both or neither")
    if tls["client_cert_auth"] and not (tls["cert_file"] and tls["trusted_ca_file"]):
        raise UsageError("--client-cert-auth needs --cert-file, --key-file and "
                         "--trusted-ca-file (the CA that signs client certificates)")
    peer = [tls[k] for k in ("peer_cert_file", "peer_key_file", "peer_trusted_ca_file")]
    if any(peer) and not all(peer):
        raise UsageError("mutual TLS on the peer port needs all of --peer-cert-file, "
                         "--peer-key-file and --peer-trusted-ca-file")
    return tls


def _archive_protection(raw: Mapping[str, str | None]) -> dict[str, object]:
    """`archive_keys` and `s3_encryption` from their flags; a key file that cannot be read or
    holds fewer than 16 bytes is a usage error."""
    keys = None
    if raw["archive_signing_key_file"]:
        try:
            keys = ManifestKeys.parse(raw["archive_signing_key_file"])
        except ValueError as exc:
            raise UsageError(f"--archive-signing-key-file: {exc}") from None
    try:
        encryption = S3Encryption.parse(raw["s3_sse"], raw["s3_sse_kms_key_id"])
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return {"archive_keys": keys, "s3_encryption": encryption}


def _restore_time(text: str | None, restore_from: str | None,
                  restore_index: int | None) -> int | None:
    """`--restore-time` in ms. It picks a point of the archive `--restore-from` names, and
    says the same as `--restore-index` in another way, so both at once is a mistake."""
    if text is None:
        return None
    if not restore_from:
        raise UsageError("--restore-time needs --restore-from: the archive to restore from")
    if restore_index is not None:
        raise UsageError("give --restore-index or --restore-time, not both: each picks the "
                         "point to restore")
    try:
        return parse_time(text)
    except ValueError as exc:
        raise UsageError(f"--restore-time: {exc}") from None


def _host_port(text: str, flag: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{flag} must be HOST:PORT (for example 127.0.0.1:2380), not {text!r}")
    return host.strip("[]"), int(port)


def _url_host(addr: tuple[str, int]) -> str:
    host = addr[0]
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"


def _check_url(url: str, flag: str) -> None:
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"{flag} must be an http(s) URL such as http://10.0.0.1:2380, "
                         f"not {url!r}")


def _initial_cluster(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    members: dict[str, str] = {}
    for part in text.split(","):
        name, sep, url = part.strip().partition("=")
        if not sep or not name or not url:
            raise UsageError(f"--initial-cluster entries must be NAME=URL (for example "
                             f"n1=http://127.0.0.1:2380), not {part!r}")
        if not MEMBER_NAME.fullmatch(name):
            raise UsageError(f"--initial-cluster: a member name is {NAME_RULE}, not {name!r}")
        _check_url(url, "--initial-cluster")
        if name in members:
            raise UsageError(f"--initial-cluster names {name} twice")
        members[name] = url.rstrip("/")
    return members


def _positive_int(text: str | None, flag: str, default: int, minimum: int = 1) -> int:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{flag} must be a whole number, not {text!r}") from None
    if value < minimum:
        raise UsageError(f"{flag} must be at least {minimum}, not {value}")
    return value


def _bool(text: str | None, flag: str) -> bool:
    if text is None:
        return True
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise UsageError(f"{flag} must be true or false, not {text!r}")
