"""A RaftCluster object read into frozen dataclasses, with every default applied and checked.

The API server applies the CRD's defaults and validation, but the operator must not depend on
that: objects created before a default existed, and test servers (kmock) that apply none,
reach the handlers too. So `ClusterSpec.from_body` applies the same defaults and checks the
same rules (OpenAPI and CEL) itself, and says in one sentence which field is wrong and what
would be right. A spec that passes here renders into manifests the node accepts as flags.

Pure: the standard library plus the node's own RFC 3339 parser, so `flotilla scale` and the
planner tests import it without kopf.
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from flotilla.node.archive.timeindex import format_ms, parse_time

from . import podoptions
from .podoptions import PodOptions

GROUP = "flotilla.dev"
VERSION = "v1alpha1"
KIND = "RaftCluster"
API_VERSION = f"{GROUP}/{VERSION}"

DEFAULT_IMAGE = "flotilla:0.1.0"
CLIENT_PORT = 2379
PEER_PORT = 2380

MAX_REPLICAS = 99
# StatefulSet pods carry the label controller-revision-hash = NAME-<10 characters>, and label
# values stop at 63 characters; the peer Service NAME-peers must be a DNS-1035 label.
MAX_NAME_LENGTH = 52
MAX_CLUSTER_ID_LENGTH = 63

_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_CLUSTER_ID = re.compile(r"[a-z0-9.-]+")
_OLD_CLUSTER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # the archive's rule
_RATIO = re.compile(r"0(\.[0-9]+)?|1(\.0+)?")
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_ARCHIVE_EXAMPLE = "s3://bucket/prefix or file:///absolute/path"
# The pipeline's durations (`--min-compaction-lag 24h`): a whole number of seconds, minutes or
# hours. Six digits at most, so that any of them is a valid Kubernetes CEL duration too.
_DURATION = re.compile(r"(?P<number>[0-9]{1,6})(?P<unit>[smh])")
_SECONDS = {"s": 1, "m": 60, "h": 3600}
# A CronJob's schedule: what the API server accepts (robfig/cron's standard parser): five
# fields, or one of these shorthands.
CRON_SHORTHANDS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight",
                   "@hourly")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_CRON_FIELDS = (  # name, lowest, highest, names for 1.. or 0.. upwards
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, {name: i + 1 for i, name in enumerate(_MONTHS)}),
    ("day-of-week", 0, 6, {name: i for i, name in enumerate(_WEEKDAYS)}),
)
# The scheduled pipeline jobs: the field of spec.archive that asks for one, and the pipeline
# job it runs, which also names its CronJob (NAME-compact, NAME-export).
ARCHIVE_JOBS = {"compaction": "compact", "export": "export"}
MAX_CRONJOB_NAME_LENGTH = 52  # the API server's limit: Job names add 11 characters
# Member certificates live a year unless spec.tls.duration says otherwise, and are renewed
# when a third of their lifetime is left (cert-manager's default renewal point).
DEFAULT_CERTIFICATE_DURATION = "8760h"
MIN_CERTIFICATE_SECONDS = 3600  # cert-manager's own floor for a Certificate's duration
CERT_MANAGER_GROUP = "cert-manager.io"
ISSUER_KINDS = ("Issuer", "ClusterIssuer")
# The member container's requests and limits when spec.resources sets none (docs/operator.md
# says why): the scheduler reserves a quarter of a core and 512 MiB, and memory is capped at
# 1 GiB. No CPU limit: CFS throttling stretches heartbeats past the election timeout.
DEFAULT_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"},
                     "limits": {"memory": "1Gi"}}
# What a NetworkPolicy peer (spec.network.clientFrom) may hold, as the API server reads it.
_PEER_KEYS = ("podSelector", "namespaceSelector", "ipBlock")
_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")  # a key of a Secret's data, as the API server checks
# S3 server-side encryption of what the archive writes (the node's and pipeline's --s3-sse).
SSE_TYPES = ("AES256", "aws:kms")
DEFAULT_SIGNING_KEY = "signing-key"
MAX_PREVIOUS_SIGNING_KEYS = 8


class SpecError(ValueError):
    """A RaftCluster the operator will not act on; the message names the field and the fix."""


@dataclass(frozen=True)
class Resources:
    """The node container's requests and limits (quantities as strings, checked)."""

    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Storage:
    size: str = "1Gi"
    storage_class_name: str | None = None  # None: the cluster's default class; "" means none
    removed_volume_policy: str = "Delete"  # Delete | Retain: the PVC of a scaled-away member


@dataclass(frozen=True)
class SecretKey:
    """One key of a Secret in the cluster's namespace; its value never leaves the Secret."""

    name: str
    key: str


@dataclass(frozen=True)
class Compaction:
    """spec.archive.compaction: `flotilla pipeline compact` on a schedule. A setting left
    None is not passed, so the pipeline's own default applies."""

    schedule: str  # cron, in UTC
    min_compaction_lag: str | None = None  # durations as the pipeline reads them: 24h, 30m, 0s
    delete_retention: str | None = None
    max_compaction_lag: str | None = None
    min_cleanable_dirty_ratio: float | None = None  # more than 0, at most 1
    suspend: bool = False


@dataclass(frozen=True)
class Export:
    """spec.archive.export: `flotilla pipeline export` of the change log on a schedule."""

    schedule: str  # cron, in UTC
    destination: str  # s3://bucket/prefix or file:///path, written with the archive's credentials
    format: str = "parquet"  # parquet | delta
    suspend: bool = False


@dataclass(frozen=True)
class SigningKey:
    """spec.archive.signingKeySecret: the key that signs manifests (`key` of Secret `name`),
    and keys of the same Secret that still verify the ones signed before a rotation."""

    name: str
    key: str = DEFAULT_SIGNING_KEY
    previous_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Encryption:
    """spec.archive.encryption: how the store encrypts what the archive writes (--s3-sse)."""

    type: str  # AES256 | aws:kms
    kms_key_id: str | None = None  # only with aws:kms; None: the account's aws/s3 key


@dataclass(frozen=True)
class Archive:
    url: str
    endpoint: str | None = None
    region: str | None = None
    access_key_id: SecretKey | None = None  # both or neither: from spec.archive.credentialsSecret
    secret_access_key: SecretKey | None = None
    keep_snapshots: int = 3
    interval_ms: int = 5000
    compaction: Compaction | None = None
    export: Export | None = None
    # spec.archive.signingKeySecret: every manifest written is signed, every one read verified
    signing_key: SigningKey | None = None
    encryption: Encryption | None = None

    def scheduled(self) -> dict[str, Compaction | Export]:
        """The scheduled jobs asked for, by kind: their field's name, a key of ARCHIVE_JOBS."""
        jobs = {"compaction": self.compaction, "export": self.export}
        return {kind: job for kind, job in jobs.items() if job is not None}


@dataclass(frozen=True)
class Restore:
    """spec.bootstrap.restore: the first members start from an old cluster's archive.

    With `index` or `time` (at most one), a point in time: the pipeline's snapshot-at runs as
    a Job first and publishes that state as a new cluster in the same archive, and the members
    restore that cluster's newest (its only) state.
    """

    url: str
    cluster_id: str | None = None  # which old cluster, when the archive holds several
    index: int | None = None  # None: the newest snapshot (or `time`)
    time: str | None = None  # RFC 3339 in UTC with milliseconds, as format_ms writes it

    @property
    def point_in_time(self) -> bool:
        return self.index is not None or self.time is not None

    @property
    def target(self) -> str:
        """The point in words: `index 120000`, `time 2026-11-25T17:00:00.250Z`, `the newest
        archived state`."""
        if self.index is not None:
            return f"index {self.index}"
        if self.time is not None:
            return f"time {self.time}"
        return "the newest archived state"


@dataclass(frozen=True)
class IssuerRef:
    """spec.tls.issuerRef: the cert-manager Issuer or ClusterIssuer that signs the members'
    certificates (the operator then renders cert-manager Certificates instead of issuing)."""

    name: str
    kind: str = "Issuer"
    group: str = CERT_MANAGER_GROUP


@dataclass(frozen=True)
class Tls:
    """spec.tls: TLS on both member ports, on by default.

    Who signs the member certificates: cert-manager (`issuer_ref`), a CA of the user's own in
    the Secret `secret_name` (its tls.crt and tls.key), or by default a CA the operator makes
    for the cluster (the Secret NAME-ca)."""

    enabled: bool = True
    issuer_ref: IssuerRef | None = None
    client_cert_auth: bool = False  # clients (the operator too) must show a certificate
    secret_name: str | None = None
    duration: str = DEFAULT_CERTIFICATE_DURATION
    # A cluster that bootstrapped before spec.tls existed (its status records no TLS): it runs
    # without TLS whatever the defaulted spec says, as its committed peer URLs are http.
    legacy: bool = False

    @property
    def issuer(self) -> str:
        """Who signs, in words that status.tls.issuer records: `operator`, `secret/NAME`,
        `cert-manager/KIND/NAME`; `none` without TLS."""
        if not self.enabled:
            return "none"
        if self.issuer_ref is not None:
            return f"cert-manager/{self.issuer_ref.kind}/{self.issuer_ref.name}"
        if self.secret_name is not None:
            return f"secret/{self.secret_name}"
        return "operator"

    @property
    def seconds(self) -> int:
        return seconds(self.duration)


@dataclass(frozen=True)
class Network:
    """spec.network: the NetworkPolicy the operator renders for the cluster."""

    policy: bool = True
    # NetworkPolicy peers allowed to reach the client port; None: every pod of the namespace.
    client_from: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class StateMachine:
    """spec.stateMachine: the members' replicated state machine, `module:Class` (the node's
    --state-machine), and the image that carries its module (None: spec.image)."""

    cls: str
    image: str | None = None


@dataclass(frozen=True)
class Timing:
    election_timeout_ms: int = 1000
    heartbeat_ms: int = 100
    catch_up_timeout_seconds: int = 600  # operator only: a learner still behind is retried


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    namespace: str
    uid: str  # "" when the object has none yet (test servers); the API server always sets it
    generation: int
    replicas: int
    image: str
    image_pull_policy: str
    resources: Resources
    storage: Storage
    snapshot_policy: str | None  # the node's --snapshot-policy; None: the node's default
    archive: Archive | None
    restore: Restore | None  # None: bootstrap.new
    timing: Timing
    admin_token: SecretKey | None
    final_snapshot: bool  # only acted on with an archive: there is nowhere else to ship it
    cluster_id: str
    tls: Tls = field(default_factory=Tls)
    network: Network = field(default_factory=Network)
    state_machine: StateMachine | None = None  # None: the built-in key-value machine
    pod: PodOptions = field(default_factory=PodOptions)  # spec.pod: where and how pods run

    @classmethod
    def from_body(cls, body: Mapping[str, Any], default_image: str = DEFAULT_IMAGE) -> ClusterSpec:
        """Read a RaftCluster (metadata, spec, status); raises SpecError for the first mistake."""
        metadata = _Fields(body.get("metadata"), "metadata")
        name = _object_name(metadata.string("name", required="the RaftCluster's name"))
        namespace = metadata.string("namespace") or "default"
        uid = metadata.string("uid") or ""
        spec = _Fields(body.get("spec"), "spec")
        status = body.get("status")
        recorded_id = status.get("clusterId") if isinstance(status, Mapping) else None
        archive = _archive(spec.section("archive")) if spec.present("archive") else None
        if archive is not None:
            _check_cronjob_names(name, archive)
        restore = _bootstrap(spec.section("bootstrap")) if spec.present("bootstrap") else None
        admin_token = (_secret_key(spec.section("adminTokenSecret"), "key", "token")
                       if spec.present("adminTokenSecret") else None)
        tls = _tls_as_running(_tls(spec.section("tls"), name),
                              status if isinstance(status, Mapping) else {})
        machine = (_state_machine(spec.section("stateMachine"))
                   if spec.present("stateMachine") else None)
        try:
            pod = podoptions.parse(spec.values.get("pod"), spec.where("pod"))
        except podoptions.PodOptionError as exc:
            raise SpecError(str(exc)) from None
        return cls(
            name=name,
            namespace=namespace,
            uid=uid,
            generation=metadata.integer("generation", default=0, minimum=0),
            replicas=spec.integer("replicas", default=3, minimum=1, maximum=MAX_REPLICAS),
            # The image that carries the user's state machine runs the members and Jobs.
            image=(machine.image if machine is not None and machine.image else None)
            or spec.string("image") or default_image,
            image_pull_policy=spec.choice(
                "imagePullPolicy", ("Always", "IfNotPresent", "Never"), "IfNotPresent"
            ),
            resources=_resources(spec.section("resources")),
            storage=_storage(spec.section("storage")),
            snapshot_policy=_snapshot_policy(spec.section("snapshot")),
            archive=archive,
            restore=restore,
            timing=_timing(spec.section("timing")),
            admin_token=admin_token,
            final_snapshot=spec.section("deletion").boolean("finalSnapshot", default=True),
            cluster_id=_cluster_id(spec, recorded_id, namespace, name, uid),
            tls=tls,
            network=_network(spec.section("network")),
            state_machine=machine,
            pod=pod,
        )

    # --- names every owned object and member derives from ------------------------------------

    @property
    def peer_service_name(self) -> str:
        return f"{self.name}-peers"

    @property
    def client_service_name(self) -> str:
        return self.name

    @property
    def selector_labels(self) -> dict[str, str]:
        """What the StatefulSet, Services and PDB select on: never changes for a cluster."""
        return {"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/instance": self.name}

    @property
    def labels(self) -> dict[str, str]:
        return {
            **self.selector_labels,
            "app.kubernetes.io/managed-by": "flotilla-operator",
            "app.kubernetes.io/component": "raft-member",
        }

    @property
    def restore_job_labels(self) -> dict[str, str]:
        """The point-in-time restore Job and its pod. Not the members' name label: the
        StatefulSet, the Services and the budget select on name and instance, and must never
        take the Job's pod for a member."""
        return {
            "app.kubernetes.io/name": "flotilla-restore",
            "app.kubernetes.io/instance": self.name,
            "app.kubernetes.io/managed-by": "flotilla-operator",
            "app.kubernetes.io/component": "restore-job",
        }

    @property
    def restore_job_selector(self) -> str:
        return ",".join(f"{key}={value}" for key, value in self.restore_job_labels.items())

    def archive_job_name(self, kind: str) -> str:
        """The CronJob of spec.archive.<kind> (compaction, export): NAME-compact, NAME-export."""
        return f"{self.name}-{ARCHIVE_JOBS[kind]}"

    def archive_job_labels(self, kind: str) -> dict[str, str]:
        """A scheduled job's CronJob, its Jobs and their pods. Like the restore Job's, not
        the members' name label, so no member selector takes its pods for members."""
        job = ARCHIVE_JOBS[kind]
        return {
            "app.kubernetes.io/name": f"flotilla-{job}",
            "app.kubernetes.io/instance": self.name,
            "app.kubernetes.io/managed-by": "flotilla-operator",
            "app.kubernetes.io/component": f"{job}-job",
        }

    def archive_job_selector(self, kind: str) -> str:
        return ",".join(f"{k}={v}" for k, v in self.archive_job_labels(kind).items())

    @property
    def archive_jobs_selector(self) -> str:
        """Every CronJob the operator made for this cluster (both kinds)."""
        return (f"app.kubernetes.io/instance={self.name},"
                "app.kubernetes.io/managed-by=flotilla-operator")

    @property
    def selector(self) -> str:
        """The label selector string for status.selector (the scale subresource's)."""
        return ",".join(f"{key}={value}" for key, value in self.selector_labels.items())

    def member_names(self, n: int) -> list[str]:
        """The StatefulSet's first n pods, which are the members' names."""
        return [f"{self.name}-{ordinal}" for ordinal in range(n)]

    def member_host(self, member: str) -> str:
        """The member's stable DNS name through the headless peer Service."""
        return f"{member}.{self.peer_service_name}.{self.namespace}.svc"

    @property
    def scheme(self) -> str:
        """How members are dialled: https on both ports with TLS (the default), else http."""
        return "https" if self.tls.enabled else "http"

    def peer_url(self, member: str) -> str:
        return f"{self.scheme}://{self.member_host(member)}:{PEER_PORT}"

    def client_url(self, member: str) -> str:
        return f"{self.scheme}://{self.member_host(member)}:{CLIENT_PORT}"

    @property
    def admin_token_secret(self) -> SecretKey:
        """Where the members' admin token is: spec.adminTokenSecret, else the Secret the
        operator generates, NAME-admin-token (key `token`)."""
        return self.admin_token or SecretKey(f"{self.name}-admin-token", "token")

    @property
    def container_resources(self) -> dict[str, dict[str, str]]:
        """The member container's resources: spec.resources, or DEFAULT_RESOURCES when it
        sets neither requests nor limits."""
        own = {kind: dict(values) for kind, values in (("requests", self.resources.requests),
                                                       ("limits", self.resources.limits))
               if values}
        return own or {kind: dict(values) for kind, values in DEFAULT_RESOURCES.items()}

    # --- TLS: the Secrets and the names on the certificates ------------------------------------

    @property
    def ca_secret_name(self) -> str | None:
        """The Secret of the CA the operator signs member certificates with: the user's
        (spec.tls.secretName) or its own NAME-ca; None when cert-manager signs."""
        if self.tls.issuer_ref is not None:
            return None
        return self.tls.secret_name or f"{self.name}-ca"

    @staticmethod
    def member_tls_secret(member: str) -> str:
        """The Secret holding a member's certificate, key and CA (tls.crt, tls.key, ca.crt)."""
        return f"{member}-tls"

    @property
    def client_tls_secret(self) -> str:
        """The client certificate the operator shows members run with clientCertAuth."""
        return f"{self.name}-client-tls"

    def member_dns_names(self, member: str) -> list[str]:
        """The names on a member's certificate: the member's own name first (the peers'
        identity check reads it), its DNS names under the headless peer Service, the client
        Service's names, and localhost (`kubectl port-forward`, the probes)."""
        peers, ns, svc = self.peer_service_name, self.namespace, self.client_service_name
        return [
            member,
            f"{member}.{peers}", f"{member}.{peers}.{ns}", f"{member}.{peers}.{ns}.svc",
            f"{member}.{peers}.{ns}.svc.cluster.local",
            svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local",
            "localhost", "127.0.0.1",
        ]

    def initial_cluster(self, members: Sequence[str]) -> str:
        """The node's --initial-cluster for these members: N1=URL,N2=URL."""
        return ",".join(f"{member}={self.peer_url(member)}" for member in members)

    @property
    def restore_job_name(self) -> str:
        return f"{self.name}-restore"

    @property
    def restored_cluster_id(self) -> str | None:
        """With a point-in-time restore, the cluster id the snapshot Job publishes that state
        under, and the members restore from: `<clusterId>-at-<index>`, or
        `<clusterId>-at-<time>` with the time written `20261125t170000.250z`.

        A function of this RaftCluster alone, so a rerun of the Job publishes under the same
        id (which the pipeline takes as done), and never this cluster's own id, under which
        it will archive. At most 63 + 4 + 20 characters: within the archive's 128."""
        restore = self.restore
        if restore is None or not restore.point_in_time:
            return None
        if restore.index is not None:
            return f"{self.cluster_id}-at-{restore.index}"
        assert restore.time is not None
        return f"{self.cluster_id}-at-{re.sub(r'[-:]', '', restore.time).lower()}"

    @staticmethod
    def quorum(n: int) -> int:
        """A majority of n voters: what must stay up."""
        return n // 2 + 1


# --- sections ----------------------------------------------------------------------------------


def _object_name(name: str) -> str:
    if len(name) > MAX_NAME_LENGTH or not _NAME.fullmatch(name):
        raise SpecError(
            f"metadata.name {name!r} cannot name a Raft cluster: use at most "
            f"{MAX_NAME_LENGTH} characters of a-z, 0-9 and '-', starting with a letter "
            "(it names the StatefulSet, its pods and the NAME-peers Service)"
        )
    return name


def _resources(fields: _Fields) -> Resources:
    requests = fields.quantities("requests")
    limits = fields.quantities("limits")
    for resource, request in requests.items():
        limit = limits.get(resource)
        if limit is not None and parse_quantity(request) > parse_quantity(limit):
            raise SpecError(
                f"spec.resources.requests.{resource} ({request}) must not exceed "
                f"spec.resources.limits.{resource} ({limit})"
            )
    return Resources(requests, limits)


def _storage(fields: _Fields) -> Storage:
    size = fields.quantity("size", default="1Gi")
    if parse_quantity(size) <= 0:
        raise SpecError(f"{fields.where('size')} ({size}) must be more than 0, e.g. 1Gi")
    return Storage(
        size=size,
        storage_class_name=fields.string("storageClassName"),
        removed_volume_policy=fields.choice("removedVolumePolicy", ("Delete", "Retain"), "Delete"),
    )


def _snapshot_policy(fields: _Fields) -> str | None:
    """The node's policy syntax, rules in a fixed order; None leaves the node's default."""
    rules: list[str] = []
    ratio = fields.string("ratio")
    if ratio is not None:
        if not _RATIO.fullmatch(ratio) or Decimal(ratio) == 0:
            raise SpecError(
                f"{fields.where('ratio')} must be a decimal more than 0 and at most 1, "
                f'written as a string such as "0.1", not {ratio!r}'
            )
        rules.append(f"ratio={ratio}")
    if fields.present("logBytes"):
        text = fields.quantity("logBytes", default="0")
        size = parse_quantity(text)
        if size <= 0 or size != size.to_integral_value() or size >= 2**63:
            raise SpecError(
                f"{fields.where('logBytes')} ({text}) must be a whole number of bytes more "
                "than 0, such as 64Mi"
            )
        rules.append(f"log-bytes={_node_size(int(size))}")
    entries = fields.optional_integer("entries", minimum=1)
    if entries is not None:
        rules.append(f"entries={entries}")
    return ",".join(rules) or None


def _archive(fields: _Fields) -> Archive:
    url = _archive_url(fields, "url")
    endpoint = fields.string("endpoint") or None
    if endpoint is not None and not re.fullmatch(r"https?://[^/@\s]+(/\S*)?", endpoint):
        raise SpecError(
            f"{fields.where('endpoint')} must be an http:// or https:// URL without "
            f"credentials, such as http://minio.minio:9000, not {endpoint!r}"
        )
    access_key_id = secret_access_key = None
    if fields.present("credentialsSecret"):
        credentials = fields.section("credentialsSecret")
        access_key_id = _secret_key(credentials, "accessKeyIdKey", "AWS_ACCESS_KEY_ID")
        secret_access_key = _secret_key(credentials, "secretAccessKeyKey",
                                        "AWS_SECRET_ACCESS_KEY")
    return Archive(
        url=url,
        endpoint=endpoint,
        region=fields.string("region") or None,
        access_key_id=access_key_id,
        secret_access_key=secret_access_key,
        keep_snapshots=fields.integer("keepSnapshots", default=3, minimum=1),
        interval_ms=fields.integer("intervalMs", default=5000, minimum=100),
        compaction=(_compaction(fields.section("compaction"))
                    if fields.present("compaction") else None),
        export=_export(fields.section("export")) if fields.present("export") else None,
        signing_key=(_signing_key(fields.section("signingKeySecret"))
                     if fields.present("signingKeySecret") else None),
        encryption=(_encryption(fields.section("encryption"))
                    if fields.present("encryption") else None),
    )


def _signing_key(fields: _Fields) -> SigningKey:
    """spec.archive.signingKeySecret: a Secret of the namespace, the key holding the manifest
    signing key, and older keys of that Secret that still verify (their values are checked by
    the node: at least 16 bytes)."""
    name = _dns_name(fields, "name", "the Secret holding the archive's signing key")
    key = _data_key(fields.string("key") or DEFAULT_SIGNING_KEY, fields.where("key"))
    previous = fields.values.get("previousKeys") or []
    where = fields.where("previousKeys")
    if not isinstance(previous, list) or len(previous) > MAX_PREVIOUS_SIGNING_KEYS:
        raise SpecError(f"{where} must be a list of at most {MAX_PREVIOUS_SIGNING_KEYS} keys of "
                        f"Secret {name} (older signing keys that still verify), not "
                        f"{previous!r}")
    previous_keys = tuple(_data_key(k, f"{where}[{i}]") for i, k in enumerate(previous))
    if len({key, *previous_keys}) != 1 + len(previous_keys):
        raise SpecError(f"{where} repeats a key or names {fields.where('key')} ({key}): list "
                        "each older key once, apart from the one that signs")
    return SigningKey(name, key, previous_keys)


def _data_key(key: object, where: str) -> str:
    if not isinstance(key, str) or len(key) > 253 or not _SECRET_KEY.fullmatch(key):
        raise SpecError(f"{where} must be a key of a Secret (a-z, A-Z, 0-9, '-', '_' and '.', "
                        f"at most 253 characters), not {key!r}")
    return key


def _encryption(fields: _Fields) -> Encryption:
    """spec.archive.encryption: the type, and a KMS key only with aws:kms."""
    if not fields.present("type"):
        raise SpecError(f"{fields.where('type')} is required: {' or '.join(SSE_TYPES)}")
    kind = fields.choice("type", SSE_TYPES, SSE_TYPES[0])
    kms_key_id = fields.string("kmsKeyId") or None
    if kms_key_id is not None and (len(kms_key_id) > 2048 or any(c.isspace()
                                                                  for c in kms_key_id)):
        raise SpecError(f"{fields.where('kmsKeyId')} must be a KMS key id, ARN or alias (no "
                        f"spaces, at most 2048 characters), not {kms_key_id!r}")
    if kms_key_id is not None and kind != "aws:kms":
        raise SpecError(f"{fields.where('kmsKeyId')} goes with type aws:kms, not {kind}: "
                        "remove it, or set type to aws:kms")
    return Encryption(kind, kms_key_id)


def _compaction(fields: _Fields) -> Compaction:
    compaction = Compaction(
        schedule=_schedule(fields),
        min_compaction_lag=_duration(fields, "minCompactionLag"),
        delete_retention=_duration(fields, "deleteRetention"),
        max_compaction_lag=_duration(fields, "maxCompactionLag"),
        min_cleanable_dirty_ratio=_dirty_ratio(fields, "minCleanableDirtyRatio"),
        suspend=fields.boolean("suspend", default=False),
    )
    least, most = compaction.min_compaction_lag, compaction.max_compaction_lag
    if least is not None and most is not None and seconds(least) > seconds(most):
        raise SpecError(
            f"{fields.where('minCompactionLag')} ({least}) must not exceed "
            f"{fields.where('maxCompactionLag')} ({most}): no entry younger than the first is "
            "compacted, and every entry older than the second is, whatever the dirty ratio"
        )
    return compaction


def _export(fields: _Fields) -> Export:
    return Export(
        schedule=_schedule(fields),
        destination=_archive_url(fields, "destination", meaning="where the change log goes"),
        format=fields.choice("format", ("parquet", "delta"), "parquet"),
        suspend=fields.boolean("suspend", default=False),
    )


# module:attribute, where the module is a dotted import path and the attribute may be dotted
# (a class inside a class): what the node's --state-machine and the pipeline's take.
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_STATE_MACHINE = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}(\.{_IDENTIFIER})*")


def _state_machine(fields: _Fields) -> StateMachine:
    where = fields.where("class")
    spec = fields.string("class", required="the state machine as module:Class, such as "
                         "counter.machine:Counter")
    if spec is None or not _STATE_MACHINE.fullmatch(spec):
        raise SpecError(
            f"{where} must be module:Class, a Python module path and the machine's class in it "
            f"(such as counter.machine:Counter, or pkg.mod:Outer.Machine), not {spec!r}; "
            "leave spec.stateMachine out for the built-in key-value machine")
    return StateMachine(cls=spec, image=fields.string("image") or None)


def _check_cronjob_names(name: str, archive: Archive) -> None:
    for kind in archive.scheduled():
        cronjob = f"{name}-{ARCHIVE_JOBS[kind]}"
        if len(cronjob) > MAX_CRONJOB_NAME_LENGTH:
            longest = MAX_CRONJOB_NAME_LENGTH - len(cronjob) + len(name)
            raise SpecError(
                f"metadata.name {name!r} is too long for spec.archive.{kind}: its CronJob "
                f"{cronjob} may have at most {MAX_CRONJOB_NAME_LENGTH} characters, so the "
                f"RaftCluster's name at most {longest}; run the job by hand, or use a shorter "
                "name"
            )


def _schedule(fields: _Fields) -> str:
    where = fields.where("schedule")
    schedule = fields.string("schedule", required='when to run, in cron syntax, such as '
                             '"0 3 * * *" (03:00 UTC every day)')
    problem = cron_problem(schedule)
    if problem is not None:
        raise SpecError(
            f"{where} must be a cron schedule: five fields (minute hour day-of-month month "
            f'day-of-week, in UTC, such as "0 3 * * *" or "*/30 * * * mon-fri") or one of '
            f"{', '.join(CRON_SHORTHANDS)}; {schedule!r} {problem}"
        )
    return schedule


def cron_problem(schedule: str) -> str | None:
    """What is wrong with a cron schedule, in words ("has 4 fields"), or None if the API
    server takes it for a CronJob: five fields of values, `*` or `?`, ranges (`1-5`), lists
    (`1,15`) and steps (`*/10`, `5-50/5`); months and weekdays also by name (jan, mon)."""
    if schedule in CRON_SHORTHANDS:
        return None
    parts = schedule.split()
    if len(parts) != len(_CRON_FIELDS):
        return f"has {len(parts)} field{'s' if len(parts) != 1 else ''}"
    for part, (name, lowest, highest, names) in zip(parts, _CRON_FIELDS, strict=True):
        for item in part.split(","):
            span, slash, step = item.partition("/")
            bad_step = slash and not (step.isdigit() and int(step) > 0)
            if span in ("*", "?") and not bad_step:
                continue
            first, dash, last = span.partition("-")
            ends = [_cron_value(end, names) for end in ((first, last) if dash else (first,))]
            if (bad_step or None in ends or any(not lowest <= end <= highest for end in ends)
                    or ends[0] > ends[-1]):
                return (f"has {item!r} as its {name}: use {lowest}-{highest}"
                        f"{' or names' if names else ''}, '*', a range, a list or a step")
    return None


def _cron_value(text: str, names: Mapping[str, int]) -> int | None:
    if text.isdigit():
        return int(text)
    return names.get(text.lower())


def _duration(fields: _Fields, key: str) -> str | None:
    value = fields.string(key)
    if value is not None and not _DURATION.fullmatch(value):
        raise SpecError(
            f"{fields.where(key)} must be a duration: a whole number of seconds, minutes or "
            f"hours of at most 6 digits, such as 30m, 24h or 0s (7 days is 168h), not {value!r}"
        )
    return value


def seconds(duration: str) -> int:
    """The seconds of a duration the spec accepts (24h -> 86400)."""
    match = _DURATION.fullmatch(duration)
    if match is None:
        raise ValueError(f"{duration!r} is not a duration such as 30m or 24h")
    return int(match["number"]) * _SECONDS[match["unit"]]


def _dirty_ratio(fields: _Fields, key: str) -> float | None:
    value = fields.values.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 0 < value <= 1):
        raise SpecError(
            f"{fields.where(key)} must be a number more than 0 and at most 1, such as 0.5 "
            f"(compact once half of the log past the lag is not compacted yet), not {value!r}"
        )
    return float(value)


def _bootstrap(fields: _Fields) -> Restore | None:
    """Exactly one of new/restore (an absent bootstrap is new); None means new."""
    has_new, has_restore = fields.present("new"), fields.present("restore")
    if has_new == has_restore:
        which = "both" if has_new else "neither"
        raise SpecError(
            f"spec.bootstrap must set exactly one of new or restore (it sets {which}): "
            "new: {} starts an empty cluster, restore: {url: ...} starts from an archive"
        )
    if has_new:
        fields.section("new")  # must be an object
        return None
    restore = fields.section("restore")
    url = _archive_url(restore, "url", meaning="the archive URL the old cluster used")
    cluster_id = restore.string("clusterId") or None
    if cluster_id is not None and not _OLD_CLUSTER_ID.fullmatch(cluster_id):
        raise SpecError(
            f"{restore.where('clusterId')} must be the old cluster's id (its status.clusterId): "
            f"1-128 letters, digits, '.', '_' or '-', starting with a letter or digit, not "
            f"{cluster_id!r}"
        )
    index = restore.optional_integer("index", minimum=1)
    time = restore.string("time")
    if time is not None:
        try:
            time = format_ms(parse_time(time))
        except ValueError as exc:
            raise SpecError(f"{restore.where('time')}: {exc}") from None
    if index is not None and time is not None:
        raise SpecError(
            f"{restore.path} sets both index and time: give one of them (index: the state "
            "at that log index; time: the state after the last entry at or before it)"
        )
    return Restore(url=url, cluster_id=cluster_id, index=index, time=time)


def _tls(fields: _Fields, name: str) -> Tls:
    enabled = fields.boolean("enabled", default=True)
    client_cert_auth = fields.boolean("clientCertAuth", default=False)
    duration = fields.string("duration") or DEFAULT_CERTIFICATE_DURATION
    if not _DURATION.fullmatch(duration) or seconds(duration) < MIN_CERTIFICATE_SECONDS:
        raise SpecError(
            f"{fields.where('duration')} must be a duration of at least 1h, in hours, minutes "
            f"or seconds of at most 6 digits, such as 8760h (a year) or 2160h, not {duration!r}"
        )
    issuer_ref = None
    if fields.present("issuerRef"):
        ref = fields.section("issuerRef")
        issuer_ref = IssuerRef(
            name=_dns_name(ref, "name", "the cert-manager Issuer or ClusterIssuer"),
            kind=ref.choice("kind", ISSUER_KINDS, "Issuer"),
            group=ref.string("group") or CERT_MANAGER_GROUP,
        )
    secret_name = (_dns_name(fields, "secretName", "a Secret holding your CA's tls.crt and "
                             "tls.key") if fields.present("secretName") else None)
    if issuer_ref is not None and secret_name is not None:
        raise SpecError(
            f"{fields.path} sets both issuerRef and secretName: give one (issuerRef: "
            "cert-manager signs the member certificates; secretName: the operator signs them "
            "with the CA in that Secret)"
        )
    if not enabled:
        given = [key for key in ("issuerRef", "secretName") if fields.present(key)]
        if client_cert_auth:
            given.append("clientCertAuth")
        if given:
            raise SpecError(
                f"{fields.path}.enabled is false, so {' and '.join(given)} would do nothing: "
                "remove them, or turn TLS on"
            )
    if secret_name is not None and secret_name == f"{name}-ca":
        raise SpecError(
            f"{fields.where('secretName')} must not be {secret_name!r}: that is the name of "
            "the CA Secret the operator makes itself; leave secretName out to use it"
        )
    return Tls(enabled=enabled, issuer_ref=issuer_ref, client_cert_auth=client_cert_auth,
               secret_name=secret_name, duration=duration)


def _tls_as_running(tls: Tls, status: Mapping[str, Any]) -> Tls:
    """spec.tls, checked against how the cluster runs. Once it has bootstrapped, whether it
    speaks TLS and who signs its certificates stay: the committed configuration holds every
    member's peer URL (http or https), and members signed by two CAs during a change would
    refuse each other. A cluster that bootstrapped before spec.tls existed records no TLS in
    its status: it keeps running without (the API server fills in `enabled: true` for it)."""
    recorded = status.get("tls")
    if not status.get("bootstrapped"):
        return tls
    if not isinstance(recorded, Mapping) or recorded.get("legacy") is True:
        return Tls(enabled=False, legacy=True)
    if isinstance(recorded.get("enabled"), bool) and recorded["enabled"] != tls.enabled:
        raise SpecError(
            f"spec.tls.enabled cannot change once the cluster has bootstrapped (it runs with "
            f"TLS {'on' if recorded['enabled'] else 'off'}): the committed configuration holds "
            "every member's peer URL; set it back, or restore the archive into a new "
            "RaftCluster"
        )
    issuer = recorded.get("issuer")
    if isinstance(issuer, str) and tls.enabled and issuer != tls.issuer:
        raise SpecError(
            f"spec.tls.issuerRef and spec.tls.secretName cannot change once the cluster has "
            f"bootstrapped (its certificates come from {issuer}, the spec now says "
            f"{tls.issuer}): members signed by two CAs would refuse each other; set them back"
        )
    return tls


def _network(fields: _Fields) -> Network:
    policy = fields.boolean("policy", default=True)
    value = fields.values.get("clientFrom")
    if value is None:
        return Network(policy=policy)
    where = fields.where("clientFrom")
    if not isinstance(value, list):
        raise SpecError(f"{where} must be a list of NetworkPolicy peers (such as "
                        "[{podSelector: {matchLabels: {app: orders}}}]), not {value!r}")
    return Network(policy=policy, client_from=tuple(
        _network_peer(peer, f"{where}[{i}]") for i, peer in enumerate(value)))


def _network_peer(peer: object, where: str) -> dict[str, Any]:
    """One NetworkPolicyPeer, checked as the API server would: podSelector and/or
    namespaceSelector, or ipBlock alone."""
    if not isinstance(peer, Mapping) or not peer:
        raise SpecError(f"{where} must be a NetworkPolicy peer: an object with podSelector, "
                        f"namespaceSelector or ipBlock, not {peer!r}")
    unknown = sorted(set(peer) - set(_PEER_KEYS))
    if unknown:
        raise SpecError(f"{where} has {', '.join(unknown)}: a NetworkPolicy peer takes only "
                        "podSelector, namespaceSelector and ipBlock")
    if "ipBlock" in peer and len(peer) > 1:
        raise SpecError(f"{where} sets ipBlock with a selector: ipBlock stands alone")
    out: dict[str, Any] = {}
    for key in ("podSelector", "namespaceSelector"):
        if key in peer:
            out[key] = _label_selector(peer[key], f"{where}.{key}")
    if "ipBlock" in peer:
        out["ipBlock"] = _ip_block(peer["ipBlock"], f"{where}.ipBlock")
    return out


def _label_selector(selector: object, where: str) -> dict[str, Any]:
    fields = _Fields(selector, where)
    unknown = sorted(set(fields.values) - {"matchLabels", "matchExpressions"})
    if unknown:
        raise SpecError(f"{where} has {', '.join(unknown)}: a label selector takes "
                        "matchLabels and matchExpressions")
    labels = fields.values.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise SpecError(f"{where}.matchLabels must map label names to string values, not "
                        f"{labels!r}")
    expressions = fields.values.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise SpecError(f"{where}.matchExpressions must be a list, not {expressions!r}")
    for i, expression in enumerate(expressions):
        at = f"{where}.matchExpressions[{i}]"
        if not isinstance(expression, Mapping) or not isinstance(expression.get("key"), str):
            raise SpecError(f"{at} must be an object with a key, an operator and values")
        operator = expression.get("operator")
        if operator not in _SELECTOR_OPERATORS:
            raise SpecError(f"{at}.operator must be {' or '.join(_SELECTOR_OPERATORS)}, not "
                            f"{operator!r}")
        values = expression.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SpecError(f"{at}.values must be a list of strings, not {values!r}")
        listed = operator in ("In", "NotIn")
        if listed != bool(values):
            raise SpecError(f"{at}: {operator} takes {'a non-empty' if listed else 'no'} list "
                            "of values")
    return copy.deepcopy(dict(selector)) if isinstance(selector, Mapping) else {}


def _ip_block(block: object, where: str) -> dict[str, Any]:
    fields = _Fields(block, where)
    cidr = fields.string("cidr", required="a CIDR such as 10.0.0.0/8")
    excepted = fields.values.get("except") or []
    if not isinstance(excepted, list):
        raise SpecError(f"{where}.except must be a list of CIDRs, not {excepted!r}")
    for text, at in [(cidr, f"{where}.cidr"), *((e, f"{where}.except") for e in excepted)]:
        try:
            ipaddress.ip_network(text, strict=False)
        except (TypeError, ValueError):
            raise SpecError(f"{at} must be a CIDR such as 10.0.0.0/8, not {text!r}") from None
    return {"cidr": cidr, **({"except": list(excepted)} if excepted else {})}


def _dns_name(fields: _Fields, key: str, meaning: str) -> str:
    value = fields.string(key, required=meaning)
    if len(value) > 253 or not _SECRET_NAME.fullmatch(value):
        raise SpecError(f"{fields.where(key)} must be a Kubernetes object name (a-z, 0-9, '-' "
                        f"and '.', at most 253 characters), not {value!r}")
    return value


def _timing(fields: _Fields) -> Timing:
    timing = Timing(
        election_timeout_ms=fields.integer("electionTimeoutMs", default=1000, minimum=10,
                                           maximum=600_000),
        heartbeat_ms=fields.integer("heartbeatMs", default=100, minimum=1, maximum=60_000),
        catch_up_timeout_seconds=fields.integer("catchUpTimeoutSeconds", default=600,
                                                minimum=10),
    )
    if timing.election_timeout_ms < 2 * timing.heartbeat_ms:
        raise SpecError(
            f"spec.timing.electionTimeoutMs ({timing.election_timeout_ms}) must be at least "
            f"twice spec.timing.heartbeatMs ({timing.heartbeat_ms}); 10x is usual"
        )
    return timing


def _secret_key(fields: _Fields, key_field: str, default_key: str) -> SecretKey:
    name = fields.string("name", required="the Secret's name")
    key = fields.string(key_field) or default_key
    return SecretKey(name, key)


def _cluster_id(spec: _Fields, recorded: object, namespace: str, name: str, uid: str) -> str:
    """spec.clusterId, else the one recorded in status, else one derived from the object."""
    chosen = spec.string("clusterId")
    if chosen is not None and (len(chosen) > MAX_CLUSTER_ID_LENGTH
                               or not _CLUSTER_ID.fullmatch(chosen)):
        raise SpecError(
            f"spec.clusterId must be 1-{MAX_CLUSTER_ID_LENGTH} characters of a-z, 0-9, '-' "
            f"and '.', not {chosen!r}"
        )
    if isinstance(recorded, str) and recorded:
        if chosen is not None and chosen != recorded:
            raise SpecError(
                f"spec.clusterId ({chosen}) differs from this cluster's id {recorded} "
                "(status.clusterId): a cluster's id cannot change; set it back or remove it"
            )
        return recorded
    return chosen if chosen is not None else default_cluster_id(namespace, name, uid)


def default_cluster_id(namespace: str, name: str, uid: str) -> str:
    """"<namespace>-<name>-<first 8 of uid>", cut to 63 characters of [a-z0-9.-]."""
    suffix = re.sub(r"[^a-z0-9]", "", uid.lower())[:8]
    room = MAX_CLUSTER_ID_LENGTH - (len(suffix) + 1 if suffix else 0)
    prefix = re.sub(r"[^a-z0-9.-]+", "-", f"{namespace}-{name}".lower())[:room].strip("-.")
    return f"{prefix}-{suffix}" if suffix else prefix


def _archive_url(fields: _Fields, key: str, meaning: str = "where the archive lives") -> str:
    """The checks the node makes on --archive and --restore-from, so a pod never exits 2."""
    where = fields.where(key)
    url = fields.string(key, required=f"{meaning} ({_ARCHIVE_EXAMPLE})")
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0]
    if "@" in host:  # never echo the URL: the part before '@' may be a secret
        raise SpecError(f"{where} must not carry credentials; they come from "
                        "spec.archive.credentialsSecret")
    if scheme not in ("s3", "file"):
        hint = (": an S3-compatible endpoint goes in spec.archive.endpoint"
                if scheme in ("http", "https") else "")
        raise SpecError(f"{where} must start with s3:// or file:// (such as "
                        f"{_ARCHIVE_EXAMPLE}), not {url!r}{hint}")
    if "?" in url or "#" in url:
        raise SpecError(f"{where} must not have a query (?...) or fragment (#...), not {url!r}")
    if scheme == "s3" and not host:
        raise SpecError(f"{where} names no bucket: use s3://bucket/prefix, not {url!r}")
    if scheme == "file" and (host not in ("", "localhost") or "/" not in rest):
        raise SpecError(f"{where} must be an absolute file URL such as file:///absolute/path, "
                        f"not {url!r}")
    return url


# --- quantities ------------------------------------------------------------------------------


def parse_quantity(text: str) -> Decimal:
    """The value of a Kubernetes quantity (64Mi, 1.5G, 500m, 1e3); ValueError otherwise."""
    match = _QUANTITY.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a quantity")
    number, suffix = Decimal(match["number"]), match["suffix"] or ""
    if suffix in _BINARY:
        return number * (1024 ** _BINARY[suffix])
    try:
        exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
        return number.scaleb(exponent)
    except ArithmeticError:  # decimal's Overflow and InvalidOperation among them
        raise ValueError(f"{text!r} is out of range") from None


def _node_size(size: int) -> str:
    """Bytes in the node's size syntax (powers of 1024 named KiB, MiB, GiB)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


# --- reading fields ----------------------------------------------------------------------------


class _Fields:
    """One object of the body, read field by field; every error names the field's full path.

    A field set to null counts as absent, as it does for the API server.
    """

    def __init__(self, values: object, path: str) -> None:
        if values is None:
            values = {}
        if not isinstance(values, Mapping):
            raise SpecError(f"{path} must be an object, not {values!r}")
        self.values: Mapping[str, Any] = values
        self.path = path

    def where(self, key: str) -> str:
        return f"{self.path}.{key}"

    def present(self, key: str) -> bool:
        return self.values.get(key) is not None

    def section(self, key: str) -> _Fields:
        return _Fields(self.values.get(key), self.where(key))

    def string(self, key: str, required: str | None = None) -> str | None:
        value = self.values.get(key)
        if value is None or (value == "" and required):
            if required:
                raise SpecError(f"{self.where(key)} is required: {required}")
            return None
        if not isinstance(value, str):
            raise SpecError(f'{self.where(key)} must be a string (quote it: "{value}")')
        return value

    def choice(self, key: str, choices: Sequence[str], default: str) -> str:
        value = self.values.get(key)
        if value is None:
            return default
        if value not in choices:
            raise SpecError(f"{self.where(key)} must be {' or '.join(choices)}, not {value!r}")
        return value

    def integer(self, key: str, default: int, minimum: int, maximum: int | None = None) -> int:
        value = self.optional_integer(key, minimum, maximum)
        return default if value is None else value

    def optional_integer(self, key: str, minimum: int, maximum: int | None = None) -> int | None:
        value = self.values.get(key)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise SpecError(f"{self.where(key)} must be a whole number, not {value!r}")
        if value < minimum:
            raise SpecError(f"{self.where(key)} ({value}) must be at least {minimum}")
        if maximum is not None and value > maximum:
            raise SpecError(f"{self.where(key)} ({value}) must be at most {maximum}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.values.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise SpecError(f"{self.where(key)} must be true or false, not {value!r}")
        return value

    def quantity(self, key: str, default: str) -> str:
        """A quantity (int or string) as a string, checked; negative ones are refused."""
        return self._quantity(self.values.get(key), self.where(key), default)

    def quantities(self, key: str) -> dict[str, str]:
        """A map of resource name to quantity, such as resources.requests."""
        section = self.section(key)
        return {
            str(name): self._quantity(value, section.where(str(name)), "0")
            for name, value in section.values.items()
            if value is not None
        }

    @staticmethod
    def _quantity(value: object, where: str, default: str) -> str:
        if value is None:
            return default
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        try:
            if not isinstance(text, str) or parse_quantity(text) < 0:
                raise ValueError(text)
        except ValueError:
            raise SpecError(
                f"{where} must be a quantity such as 1Gi, 500Mi or 250m, not {value!r}"
            ) from None
        return text
