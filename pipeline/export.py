"""`flotilla pipeline export`: the change log as a Parquet (or Delta) dataset, incremental.

Layout under the destination (`--to URL`):

    changes/date=YYYY-MM-DD/<first>-<last>.parquet   one row per effective change
    entries/date=YYYY-MM-DD/<first>-<last>.parquet   every entry, for audit
    _flotilla/export.json                            whose export, its format, the high water
                                                     and every run
    _flotilla/staging/<first>-<last>/...             a run's files until they are published
    _flotilla/staging/<first>-<last>.json            a run staged whole: it is to be published

(with `--format delta`, changes/ and entries/ are Delta tables with their `_delta_log/`).
`<first>-<last>` are 20-digit indexes: a file holds rows of that range of the log (a run's
range cut into slices of SLICE_ENTRIES indexes counted from 1), so its name depends only on
the run's range and its partition, and a rerun of the same range writes the same bytes.

A run: the driver reads the destination's record (refusing another cluster's export or
another format), finishes a run an earlier process staged whole but did not publish, and
discards files an earlier process left without staging them whole; plans from the archive's
manifest (a snapshot at or below the high water plus the segments after it); Spark folds the
changes (`changes.change_stage`) and writes each slice's files to the staging prefix, one task
per slice; the driver records the staged run, publishes it (moves the files into place; for
Delta, one commit per table carrying the high water as its app transaction), and only then
records the new high water. Staging lives outside changes/ and entries/: DuckDB's globs do not
skip names starting with `_` as pyarrow and Spark do.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from flotilla.node.archive import ArchiveError, format_ms
from flotilla.node.archive.restore import RestorePlan, resolve_cluster_id
from flotilla.node.archive.urls import normalize_archive_url, parse_archive_url

from .changes import CHANGE_ROWS, CHANGES, ChangeStage, change_stage
from .source import ENTRIES, ENTRY_ROWS, ArchiveRef, Audit, arrow_schema, from_blob
from .spark import PipelineError
from .stages import describe_plan, exactly, stage, unchecked_shuffles

__all__ = ["CHANGE_COLUMNS", "ENTRY_COLUMNS", "FORMATS", "Destination", "ExportResult",
           "ExportState", "StagedRun", "export", "prepare"]

FORMATS = ("parquet", "delta")
SLICE_ENTRIES = 1 << 18  # indexes per file at most (a slice, written by one task)
STATE = "_flotilla/export.json"
STAGING = "_flotilla/staging"
APP_ID = "flotilla-export"  # the Delta app transaction whose version is the high water
TABLES = ("changes", "entries")
# The tables' columns (their date is the partition: `date=YYYY-MM-DD`, UTC, of ts_ms). Keys
# and client ids may hold lone surrogates, which Arrow's UTF-8 strings cannot: `key_bytes`
# is the key exactly (UTF-8 with surrogatepass; its byte order is the machine's key order),
# `key` is it as text with each lone surrogate replaced by U+FFFD; `client` likewise.
CHANGE_COLUMNS = ("cluster_id string, index long, term long, ts_ms long, op string, "
                  "key string, key_bytes binary, before binary, after binary")
ENTRY_COLUMNS = ("cluster_id string, index long, term long, ts_ms long, kind string, "
                 "data binary, command string, key string, key_bytes binary, "
                 "prev_index long, client string, seq long, effective boolean")
KINDS = ("normal", "membership", "noop")  # EntryKind's values, by number
COMMANDS = ("put", "delete")  # kvfold's OP_PUT and OP_DELETE
DAY_MS = 86_400_000
INTERRUPT = "FLOTILLA_EXPORT_INTERRUPT"  # a test hook: see `_checkpoint`
# What the writer tasks return: one row per file written.
FILES = "table string, date string, name string, rows long, bytes long, stats string, ops string"


# -- the destination ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Destination:
    """Where the export goes: `url` is s3://bucket/prefix or file:///absolute/path. Written
    through pyarrow's filesystems (S3 with the endpoint and the standard AWS credential
    chain), never Hadoop's connector."""

    url: str
    endpoint: str | None = None
    region: str | None = None

    @classmethod
    def parse(cls, text: str, endpoint: str | None = None,
              region: str | None = None) -> Destination:
        """ValueError says what is wrong with `text` (a plain path is a local directory)."""
        return cls(normalize_archive_url(text).rstrip("/"), endpoint, region)

    @property
    def on_s3(self) -> bool:
        return self.url.startswith("s3://")

    def filesystem(self) -> tuple[Any, str]:
        """This process's filesystem for the destination (built once) and its root path."""
        found = _filesystems.get(self)
        if found is None:
            import pyarrow.fs as pafs

            parsed = parse_archive_url(self.url)
            if parsed.scheme == "s3":
                fs = pafs.S3FileSystem(endpoint_override=self.endpoint, region=self.region)
                root = "/".join(p for p in (parsed.location, parsed.prefix) if p)
            else:
                fs, root = pafs.LocalFileSystem(), parsed.location
            found = _filesystems[self] = (fs, root)
        return found

    def path(self, *parts: str) -> str:
        return "/".join((self.filesystem()[1], *parts))

    def table_uri(self, table: str) -> str:
        """A table's location as delta-rs names it."""
        return f"{self.url}/{table}" if self.on_s3 else self.path(table)

    def storage_options(self) -> dict[str, str] | None:
        """delta-rs's options for S3 (credentials come from the environment): one writer at
        a time per destination, so no lock table (AWS_S3_ALLOW_UNSAFE_RENAME)."""
        if not self.on_s3:
            return None
        options = {"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
            if self.endpoint.startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        if self.region:
            options["AWS_REGION"] = self.region
        return options

    def make_parent(self, path: str) -> None:
        if not self.on_s3:  # S3 has no directories; a marker object would only show up
            self.filesystem()[0].create_dir(path.rsplit("/", 1)[0], recursive=True)

    def read_json(self, rel: str) -> Any | None:
        fs = self.filesystem()[0]
        path = self.path(rel)
        import pyarrow.fs as pafs

        if fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with fs.open_input_stream(path) as stream:
            data = stream.read()
        try:
            return json.loads(data)
        except ValueError:
            raise PipelineError(f"{self.url}/{rel} is not JSON: it is not a flotilla export "
                                "record; pick another --to URL", 2) from None

    def write_json(self, rel: str, doc: Any) -> None:
        """Replace `rel` whole: one PUT on S3, a rename of a temporary file on disk."""
        fs = self.filesystem()[0]
        path = self.path(rel)
        data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        self.make_parent(path)
        temporary = path if self.on_s3 else f"{path}.tmp"
        with fs.open_output_stream(temporary) as stream:
            stream.write(data)
        if temporary != path:
            fs.move(temporary, path)

    def listing(self, rel: str) -> list[Any]:
        """The files and directories right under `rel` (none if it does not exist)."""
        import pyarrow.fs as pafs

        return self.filesystem()[0].get_file_info(
            pafs.FileSelector(self.path(rel), allow_not_found=True))


_filesystems: dict[Destination, tuple[Any, str]] = {}


# -- the record -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One written file: its table and partition, its name, its rows and bytes, the Delta
    statistics of its index and time columns, and (changes) its rows by op."""

    table: str
    date: str
    name: str
    rows: int
    bytes: int
    stats: str
    ops: dict[str, int] = field(default_factory=dict)

    def path(self) -> str:
        return f"{self.table}/date={self.date}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "date": self.date, "name": self.name, "rows": self.rows,
                "bytes": self.bytes, "stats": self.stats, "ops": self.ops}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FileRecord:
        return cls(d["table"], d["date"], d["name"], d["rows"], d["bytes"], d["stats"],
                   d.get("ops") or {})


@dataclass(frozen=True, slots=True)
class StagedRun:
    """A run whose files are all staged (`_flotilla/staging/<name>.json`): publishing it
    moves them into place, commits them (Delta), and records its high water."""

    cluster_id: str
    format: str
    from_index: int  # the lowest index its rows hold (a snapshot's, for its READ rows)
    high_water: int
    files: tuple[FileRecord, ...]

    @property
    def name(self) -> str:
        return f"{self.from_index:020d}-{self.high_water:020d}"

    def rows(self, table: str) -> int:
        return sum(f.rows for f in self.files if f.table == table)

    def ops(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for f in self.files:
            for op, n in f.ops.items():
                total[op] = total.get(op, 0) + n
        return dict(sorted(total.items()))

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "cluster_id": self.cluster_id, "format": self.format,
                "from_index": self.from_index, "high_water": self.high_water,
                "files": [f.to_json() for f in self.files]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StagedRun:
        return cls(d["cluster_id"], d["format"], d["from_index"], d["high_water"],
                   tuple(FileRecord.from_json(f) for f in d["files"]))


@dataclass(frozen=True, slots=True)
class ExportState:
    """`_flotilla/export.json`: whose export the destination holds, in which format, and up
    to which index (the high water: every change and entry up to it is published, none
    after it); and what each run added."""

    cluster_id: str
    format: str
    high_water: int = 0
    runs: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "cluster_id": self.cluster_id, "format": self.format,
                "high_water": self.high_water, "runs": list(self.runs)}

    @classmethod
    def from_json(cls, d: Any, where: str) -> ExportState:
        try:
            return cls(d["cluster_id"], d["format"], int(d["high_water"]), tuple(d["runs"]))
        except (TypeError, KeyError, ValueError):
            raise PipelineError(f"{where} is not a flotilla export record; pick another --to "
                                "URL", 2) from None

    def after(self, run: StagedRun) -> ExportState:
        if run.high_water <= self.high_water:
            return self  # recorded already (the process died before it cleaned up)
        record = {"from_index": run.from_index, "high_water": run.high_water,
                  "changes": run.rows("changes"), "entries": run.rows("entries"),
                  "ops": run.ops(), "files": len(run.files),
                  "published": format_ms(time.time_ns() // 1_000_000)}
        return replace(self, high_water=run.high_water, runs=(*self.runs, record))


# -- the job --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExportResult:
    cluster_id: str
    from_index: int
    high_water: int
    changes: int
    entries: int
    location: str
    format: str

    def to_json(self) -> str:
        return json.dumps({"cluster_id": self.cluster_id, "from_index": self.from_index,
                           "high_water": self.high_water, "changes": self.changes,
                           "entries": self.entries, "location": self.location,
                           "format": self.format})


@dataclass(frozen=True, slots=True)
class Prepared:
    """A checked export: the cluster resolved, the destination's record read and matched,
    the run planned (None: nothing new). Made before Spark starts."""

    ref: ArchiveRef
    dest: Destination
    format: str
    state: ExportState | None
    pending: StagedRun | None  # staged whole by an earlier process, to publish first
    since: int  # the high water once `pending` is published
    plan: RestorePlan | None
    reads: bool  # the plan starts at a snapshot: its keys come first, as READ rows

    def describe(self) -> dict[str, Any]:
        pending = None if self.pending is None else {
            "from_index": self.pending.from_index, "high_water": self.pending.high_water}
        planned = {} if self.plan is None else {
            **describe_plan(self.plan),
            "from_index": self.plan.base_index if self.reads else self.since + 1,
            "snapshot_reads": self.reads}
        return {"cluster_id": self.ref.cluster_id, "to": self.dest.url, "format": self.format,
                "high_water": self.since, "pending": pending,
                "nothing_new": self.plan is None, **planned}


def prepare(ref: ArchiveRef, dest: Destination, format: str | None = None) -> Prepared:
    """Check an export before Spark starts: the cluster, the destination's record (another
    cluster's export, or another format, is refused: exit 2), and the plan: the newest
    snapshot at or below the high water plus the segments after it, or for a first export
    whose history retention trimmed, the oldest snapshot (exit 4 when a later run finds the
    entries after its high water gone)."""
    if format is not None and format not in FORMATS:
        raise PipelineError(f"--format {format!r}: pick one of {', '.join(FORMATS)}", 2)
    archive = ref.open()
    try:
        cluster_id = resolve_cluster_id(archive, ref.cluster_id, id_flag="--cluster-id",
                                        url_flag="--archive")
        ref = replace(ref, cluster_id=cluster_id)
        state, pending = _read_destination(dest, cluster_id, format)
        fmt = format or (state.format if state else pending.format if pending else "parquet")
        since = max(state.high_water if state else 0, pending.high_water if pending else 0)
        cluster = ref.cluster(archive)
        manifest = cluster.manifest()
        upto = manifest.last_archived_index if manifest is not None else 0
        if upto < since:
            raise PipelineError(f"{dest.url} holds {cluster_id!r}'s changes up to index "
                                f"{since}, beyond the last entry {ref.url} holds ({upto}): "
                                "is this the archive it was exported from?", 2)
        plan, reads = None, False
        if upto > since:
            candidates = cluster.restore_candidates(upto)
            plan = next((p for p in candidates if p.base_index <= since), None)
            if plan is None and since:
                oldest = candidates[-1].base_index
                raise PipelineError(
                    f"{ref.url} no longer holds the entries after index {since}, {dest.url}'s "
                    f"high water (its history starts at the snapshot at index {oldest}): "
                    "export into a new --to URL, which starts from that snapshot", 4)
            if plan is None:
                plan, reads = candidates[-1], True
        return Prepared(ref, dest, fmt, state, pending, since, plan, reads)
    except ArchiveError as exc:
        raise PipelineError(f"cannot read {ref.url}: {exc}") from None
    except OSError as exc:
        raise PipelineError(f"cannot read {dest.url}: {exc}") from None
    finally:
        archive.close()


def _read_destination(dest: Destination, cluster_id: str, format: str | None
                      ) -> tuple[ExportState | None, StagedRun | None]:
    """The destination's record and its run staged whole, if any, checked against the
    cluster and the format asked for."""
    doc = dest.read_json(STATE)
    state = None if doc is None else ExportState.from_json(doc, f"{dest.url}/{STATE}")
    staged = sorted(i.path for i in dest.listing(STAGING) if i.path.endswith(".json"))
    if len(staged) > 1:
        raise PipelineError(f"{dest.url}/{STAGING} holds {len(staged)} staged runs; one "
                            "export at a time may write a destination", 2)
    pending = None
    if staged:
        name = staged[0].rsplit("/", 1)[1]
        pending = StagedRun.from_json(dest.read_json(f"{STAGING}/{name}"))
    held = state or pending
    if held is None:
        for table in TABLES:
            if dest.listing(table):
                raise PipelineError(f"{dest.url}/{table} holds files but no flotilla export "
                                    "record: pick an empty --to URL", 2)
        return None, None
    if held.cluster_id != cluster_id:
        raise PipelineError(f"{dest.url} holds the export of cluster {held.cluster_id!r}, "
                            f"not {cluster_id!r}: export {cluster_id!r} to another --to URL",
                            2)
    if format is not None and held.format != format:
        raise PipelineError(f"{dest.url} holds a {held.format} export of {cluster_id!r}: run "
                            f"with --format {held.format}, or pick another --to URL", 2)
    return state, pending


def export(spark: Any, ref: ArchiveRef | None = None, dest: Destination | None = None,
           format: str | None = None, *, prepared: Prepared | None = None,
           slice_entries: int = SLICE_ENTRIES, tasks: int | None = None) -> ExportResult:
    """Add the changes and entries after the destination's high water up to the archive's
    last entry. What this call published is in the result (a run an earlier process staged
    and this one published included); nothing new is not an error."""
    if prepared is None:
        assert ref is not None and dest is not None
        prepared = prepare(ref, dest, format)
    job = prepared
    dest, cluster_id = job.dest, job.ref.cluster_id
    published: list[StagedRun] = []
    try:
        state = job.state or ExportState(cluster_id, job.format)
        if job.pending is not None:
            state = _publish(dest, job.pending, state)
            published.append(job.pending)
        _discard_unstaged(dest)
        if job.plan is not None:
            run = _stage_run(spark, job, slice_entries, tasks)
            dest.write_json(f"{STAGING}/{run.name}.json", run.to_json())
            state = _publish(dest, run, state)
            published.append(run)
    except OSError as exc:
        raise PipelineError(f"cannot write {dest.url}: {exc}") from None
    return ExportResult(
        cluster_id, published[0].from_index if published else job.since + 1, state.high_water,
        sum(r.rows("changes") for r in published), sum(r.rows("entries") for r in published),
        dest.url, job.format)


def _discard_unstaged(dest: Destination) -> None:
    """Files an earlier process staged without recording the run whole: never visible,
    never to be published."""
    import pyarrow.fs as pafs

    for info in dest.listing(STAGING):
        if info.type == pafs.FileType.Directory:
            dest.filesystem()[0].delete_dir(info.path)


def _publish(dest: Destination, run: StagedRun, state: ExportState) -> ExportState:
    """Move a staged run's files into place (one that is there already was moved by an
    earlier attempt), commit them (Delta: a table whose app transaction has reached the run's
    high water has them already), then record the high water, then clean up. Every step can
    be repeated, so a run interrupted anywhere is finished by the next."""
    import pyarrow.fs as pafs

    fs = dest.filesystem()[0]
    for n, record in enumerate(run.files):
        staged = dest.path(STAGING, run.name, record.path())
        final = dest.path(record.path())
        if fs.get_file_info(staged).type == pafs.FileType.File:
            dest.make_parent(final)
            fs.move(staged, final)
        elif fs.get_file_info(final).type != pafs.FileType.File:
            raise PipelineError(f"{dest.url}/{STAGING}/{run.name}/{record.path()} is gone and "
                                "was never published: delete that staged run (its .json) and "
                                "export again")
        if n == 0:
            _checkpoint("publishing")
    if run.format == "delta":
        for table in TABLES:
            _commit(dest, table, run)
            _checkpoint(f"committed {table}")
    _checkpoint("published")
    state = state.after(run)
    dest.write_json(STATE, state.to_json())
    fs.delete_file(dest.path(STAGING, f"{run.name}.json"))
    if fs.get_file_info(dest.path(STAGING, run.name)).type == pafs.FileType.Directory:
        fs.delete_dir(dest.path(STAGING, run.name))
    return state


def _commit(dest: Destination, table: str, run: StagedRun) -> None:
    """One Delta commit of the run's files of `table`, carrying the run's high water as the
    version of the app transaction APP_ID (Delta's idempotent writes: a retry sees it)."""
    from deltalake.exceptions import DeltaError

    uri, options = dest.table_uri(table), dest.storage_options()
    try:
        _commit_to(uri, options, table, run)
    except DeltaError as exc:
        raise PipelineError(f"cannot commit to the Delta table {uri}: {exc}") from None


def _commit_to(uri: str, options: dict[str, str] | None, table: str, run: StagedRun) -> None:
    from deltalake import CommitProperties, DeltaTable, Schema, Transaction
    from deltalake.transaction import AddAction, create_table_with_add_actions

    now = time.time_ns() // 1_000_000
    actions = [AddAction(f"date={f.date}/{f.name}", f.bytes, {"date": f.date}, now, True,
                         f.stats) for f in run.files if f.table == table]
    schema = Schema.from_arrow(_table_schema(table, with_date=True))
    commit = CommitProperties(app_transactions=[Transaction(APP_ID, run.high_water)])
    if not DeltaTable.is_deltatable(uri, storage_options=options):
        create_table_with_add_actions(uri, schema, actions, mode="error", partition_by=["date"],
                                      storage_options=options, commit_properties=commit)
        return
    delta = DeltaTable(uri, storage_options=options)
    if (delta.transaction_version(APP_ID) or 0) >= run.high_water:
        return
    delta.create_write_transaction(actions, mode="append", schema=schema, partition_by=["date"],
                                   commit_properties=commit)


def _checkpoint(name: str) -> None:
    """A test hook: with FLOTILLA_EXPORT_INTERRUPT=<name> the run stops here as if the
    process died (`<name>:kill` kills it with SIGKILL): 'staged' after the Spark job wrote
    the files, before the run is recorded as staged; 'publishing' after the first file is
    published; 'committed changes' after the Delta commit of changes, before that of entries;
    'published' after the files are published (and committed), before the high water is."""
    asked = os.environ.get(INTERRUPT, "")
    if asked.split(":")[0] != name:
        return
    if asked.endswith(":kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    raise Interrupted(f"interrupted at {name} ({INTERRUPT})")


class Interrupted(BaseException):
    """What `_checkpoint` raises: not an Exception, so nothing on the way cleans up."""


# -- the Spark job --------------------------------------------------------------------------


def _stage_run(spark: Any, job: Prepared, slice_entries: int, tasks: int | None) -> StagedRun:
    """Fold the plan's changes and write every slice's files to the staging prefix."""
    assert job.plan is not None
    since = None if job.reads else job.since
    with change_stage(spark, job.ref, job.plan, since=since, slice_entries=slice_entries,
                      tasks=tasks) as found:
        name = f"{found.first_index:020d}-{job.plan.index:020d}"
        write = _writer(job.dest, f"{STAGING}/{name}", job.ref.cluster_id, found,
                        job.plan.index)
        blobs = found.changes.unionByName(found.entries).select("dest", "kind", "blob")
        with unchecked_shuffles(spark), stage(spark, "export", "keys and write"):
            files = exactly(blobs, found.dests).mapInArrow(write, FILES).collect()
    _checkpoint("staged")
    records = sorted((FileRecord(t, d, n, rows, size, stats, json.loads(ops or "{}"))
                      for t, d, n, rows, size, stats, ops in files),
                     key=lambda f: (f.table, f.date, f.name))
    return StagedRun(job.ref.cluster_id, job.format, found.first_index, job.plan.index,
                     tuple(records))


def _writer(dest: Destination, staging: str, cluster_id: str, found: ChangeStage,
            high_water: int) -> Any:
    """The writer tasks' function: each task gets one slice's blobs (changes and entries)
    and writes the slice's files of each table and date; or a range of keys' READ rows."""
    audit, first, slices = found.audit, found.first_index, found.slices

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        schemas = {CHANGES: arrow_schema(CHANGE_ROWS), ENTRIES: arrow_schema(ENTRY_ROWS)}
        by_slice: dict[int, dict[int, list[Any]]] = {}
        for batch in batches:
            for dest_, kind, blob in zip(*(c.to_pylist() for c in batch.columns), strict=True):
                by_slice.setdefault(dest_, {}).setdefault(kind, []).append(
                    from_blob(blob, schemas[kind]))
        rows: list[tuple[Any, ...]] = []
        for n in sorted(by_slice):
            got = by_slice.pop(n)
            changes = pa.Table.from_batches(got.get(CHANGES, []), schemas[CHANGES])
            entries = pa.Table.from_batches(got.get(ENTRIES, []), schemas[ENTRIES])
            if n < slices:
                low, high = _slice_range(audit, n, first, high_water)
                name = f"{low:020d}-{high:020d}.parquet"
            else:  # READ rows, all at the index `first`
                name = f"{first:020d}-{first:020d}-r{n - slices:05d}.parquet"
            tables = _tables(cluster_id, changes, entries)
            for table, data in zip(TABLES, tables, strict=True):
                for date, part in _by_date(data):
                    rows.append(_write_file(dest, staging, table, date, name, part))
        schema = arrow_schema(FILES)
        yield pa.RecordBatch.from_pylist([dict(zip(schema.names, row, strict=True))
                                          for row in rows], schema=schema)

    return write


def _slice_range(audit: Audit, n: int, first: int, high_water: int) -> tuple[int, int]:
    """The indexes slice `n` (dest) covers in a run from `first` to `high_water`."""
    start = (n + audit.first_slice) * audit.slice_entries
    return max(first, start + 1), min(high_water, start + audit.slice_entries)


def _tables(cluster_id: str, changes: Any, entries: Any) -> tuple[Any, Any]:
    """A slice's rows as the tables' columns, in log order (READ rows by key)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    c = changes.sort_by([("index", "ascending"), ("key", "ascending")])
    e = entries.sort_by([("index", "ascending")])

    def constant(count: int) -> Any:
        return pa.array([cluster_id] * count, pa.string())

    out_changes = pa.Table.from_arrays(
        [constant(len(c)), c["index"], c["term"], c["ts_ms"], c["op"], _readable(c["key"]),
         c["key"], c["before"], c["after"]], schema=_table_schema("changes"))
    out_entries = pa.Table.from_arrays(
        [constant(len(e)), e["index"], e["term"], e["ts_ms"], _named(e["kind"], KINDS),
         e["data"], _named(e["op"], COMMANDS), _readable(e["key"]), e["key"], e["prev_index"],
         _readable(e["client"]), e["seq"],
         pc.is_in(e["index"], value_set=c["index"].combine_chunks())],
        schema=_table_schema("entries"))
    return out_changes, out_entries


def _table_schema(table: str, with_date: bool = False) -> Any:
    import pyarrow as pa

    schema = arrow_schema(CHANGE_COLUMNS if table == "changes" else ENTRY_COLUMNS)
    return schema.append(pa.field("date", pa.string())) if with_date else schema


def _readable(column: Any) -> Any:
    """UTF-8 bytes (lone surrogates kept, as keys and client ids travel) as Arrow strings:
    as they are when valid UTF-8 (checked by the cast), else each lone surrogate replaced by
    U+FFFD."""
    import pyarrow as pa

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    try:
        return column.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if raw is None else _replace_surrogates(raw)
                         for raw in column.to_pylist()], pa.string())


def _replace_surrogates(raw: bytes) -> str:
    text = raw.decode("utf-8", "surrogatepass")
    return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text)


def _named(codes: Any, names: Sequence[str]) -> Any:
    """Small integer codes (null kept) as their names; an unknown code as its number."""
    import pyarrow as pa

    values = codes.to_pylist()
    return pa.array([None if v is None else names[v] if 0 <= v < len(names) else str(v)
                     for v in values], pa.string())


def _by_date(table: Any) -> Iterator[tuple[str, Any]]:
    """`table`'s rows by the UTC date of their ts_ms, in date order (rows keep their order)."""
    import numpy as np
    import pyarrow as pa

    if not len(table):
        return
    days = table["ts_ms"].to_numpy() // DAY_MS
    found = np.unique(days)
    for day in found:
        part = table if len(found) == 1 else table.filter(pa.array(days == day))
        yield str(np.datetime64(int(day), "D")), part


def _write_file(dest: Destination, staging: str, table: str, date: str, name: str,
                data: Any) -> tuple[Any, ...]:
    """Write one Parquet file (zstd; no date column: it is the partition) to the staging
    prefix; its FILES row."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    fs = dest.filesystem()[0]
    path = dest.path(staging, table, f"date={date}", name)
    dest.make_parent(path)
    pq.write_table(data, path, filesystem=fs, compression="zstd")
    size = fs.get_file_info(path).size
    bounds = {c: pc.min_max(data[c]).as_py() for c in ("index", "term", "ts_ms")}
    stats = json.dumps({"numRecords": len(data),
                        "minValues": {c: b["min"] for c, b in bounds.items()},
                        "maxValues": {c: b["max"] for c, b in bounds.items()},
                        "nullCount": dict.fromkeys(bounds, 0)})
    ops = None
    if table == "changes":
        ops = json.dumps({d["values"]: d["counts"]
                          for d in pc.value_counts(data["op"]).to_pylist()}, sort_keys=True)
    return table, date, name, len(data), size, stats, ops
