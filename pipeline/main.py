"""`flotilla pipeline JOB`: Spark jobs over a cluster's archive.

Each job prints one JSON line last. Runs as `flotilla pipeline JOB ...`, or as a file handed to
`spark-submit` (it imports nothing relative, so it runs as a script). Exit codes: 0 done; 1
the job failed (one line on stderr); 2 bad flags, or something missing to run at all (PySpark,
Java); 4 a target outside the archive (the message names what the archive can give).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from flotilla.pipeline.spark import PipelineError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_OUTSIDE = 0, 1, 2, 4


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, not {text!r}")
    return int(text)


def _time(text: str) -> int:
    from flotilla.node.archive.timeindex import parse_time

    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> int:
    from flotilla.pipeline.compact import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a ratio in (0, 1], like 0.5")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        raise PipelineError(f"{message} (see `flotilla pipeline {self.prog.split()[-1]} "
                            "--help`)", EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flotilla pipeline", description=__doc__.splitlines()[0])
    jobs = parser.add_subparsers(dest="job", metavar="JOB", required=True, parser_class=_Parser)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--archive", required=True,
                        help="the archive: s3://bucket/prefix or file:///path")
    common.add_argument("--cluster-id", default=None,
                        help="the cluster in the archive (default: the only one there)")
    common.add_argument("--s3-endpoint", default=None, help="S3-compatible endpoint URL")
    common.add_argument("--s3-region", default=None, help="S3 region")
    # Archive protection (docs/archive.md#signed-manifests, #server-side-encryption).
    common.add_argument("--archive-signing-key-file", metavar="FILE[,FILE...]",
                        default=os.environ.get("FLOTILLA_ARCHIVE_SIGNING_KEY_FILE") or None,
                        help="manifests read must verify with one of these keys, and those "
                             "written are signed with the first (default: "
                             "$FLOTILLA_ARCHIVE_SIGNING_KEY_FILE)")
    common.add_argument("--s3-sse", default=None, metavar="AES256|aws:kms",
                        help="S3 server-side encryption of what the job writes into the archive")
    common.add_argument("--s3-sse-kms-key-id", default=None, metavar="ID",
                        help="with --s3-sse aws:kms: the KMS key (id, ARN or alias)")
    common.add_argument("--result-file", default=None, metavar="PATH",
                        help="also write the result line (or, on failure, the one-line reason) "
                             "to PATH: a Kubernetes Job's terminationMessagePath, say")
    common.add_argument("--master", default=None,
                        help="Spark master URL (default local[*], or the one spark-submit "
                             "was given)")

    p = jobs.add_parser("snapshot-at", parents=[common],
                        help="the exact state at an index or a time, published as a new "
                             "cluster",
                        description="Synthesize the state at --index N, or after the last "
                                    "entry stamped at or before --time T, in the node's "
                                    "snapshot format and publish it into the same archive as a "
                                    "new cluster (default id <ID>-at-<N>), so `flotilla node "
                                    "--restore-from URL --restore-cluster-id <that id>` "
                                    "restores it.")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--index", type=_positive, help="the log index")
    target.add_argument("--time", type=_time, metavar="T",
                        help="RFC 3339, e.g. 2026-11-25T17:00:00.250Z: the state after the "
                             "last entry stamped at or before T")
    p.add_argument("--exclusive", action="store_true",
                   help="with --time: the last entry stamped before T")
    p.add_argument("--state-machine", default="kv", metavar="SPEC",
                   help="the cluster's state machine, module:Class (default kv, the built-in "
                        "key-value machine, folded in parallel; any other is replayed in one "
                        "task)")
    p.add_argument("--sequential", action="store_true",
                   help="replay in one task even for the key-value machine")
    p.add_argument("--to-cluster-id", default=None, help="the new cluster's id")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (base snapshot, segments, bytes) and stop")

    p = jobs.add_parser("compact", parents=[common],
                        help="Kafka-style log compaction of the archived history",
                        description="Keep the last effective change of each key in the "
                                    "archived entries older than --min-compaction-lag (in log "
                                    "time), and delete markers for --delete-retention; the "
                                    "newer head stays whole and restorable.")
    p.add_argument("--min-compaction-lag", type=_duration, default=0, metavar="DUR",
                   help="entries younger than this, behind the newest archived one, are never "
                        "cleaned (default 0s)")
    p.add_argument("--delete-retention", type=_duration, default=24 * 3600 * 1000,
                   metavar="DUR",
                   help="how long a delete marker stays after the pass that first cleans it "
                        "(default 24h)")
    p.add_argument("--min-cleanable-dirty-ratio", type=_ratio, default=0.5, metavar="R",
                   help="clean only when the dirty bytes are at least R of the compacted and "
                        "dirty bytes (default 0.5)")
    p.add_argument("--max-compaction-lag", type=_duration, default=None, metavar="DUR",
                   help="clean whatever the ratio once the oldest dirty entry is this old "
                        "(default: never forced)")
    p.add_argument("--sequential", action="store_true",
                   help="find the effective changes by replaying the entries in one process "
                        "(the node's own machine) instead of Spark's parallel fold")
    p.add_argument("--dry-run", action="store_true",
                   help="print what a pass would clean, and stop")

    p = jobs.add_parser("export", parents=[common],
                        help="the change log as a Parquet or Delta dataset, incremental",
                        description="Add every effective change (URL/changes/) and every entry "
                                    "(URL/entries/) after the destination's recorded high "
                                    "water, up to the archive's last entry, partitioned by "
                                    "date. A destination holds one cluster's export in one "
                                    "format.")
    p.add_argument("--to", required=True, metavar="URL",
                   help="the destination: s3://bucket/prefix, file:///path or a local path "
                        "(--s3-endpoint and --s3-region apply to it too)")
    p.add_argument("--format", choices=("parquet", "delta"), default=None,
                   help="parquet (plain files) or delta (Delta tables through delta-rs); "
                        "default: what the destination holds, else parquet")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (high water, base snapshot, segments, bytes) and stop")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    result_file = _result_file(argv)  # known before parsing: a bad flag is reported there too
    try:
        line = _run(build_parser().parse_args(argv))
    except PipelineError as exc:
        return _fail(f"flotilla pipeline: {exc}", exc.exit_code, result_file)
    except Exception as exc:
        from flotilla.pipeline.spark import task_failure

        why = task_failure(exc)
        if why is None:
            raise
        return _fail(f"flotilla pipeline: the Spark job failed: {why}", EXIT_FAILED,
                     result_file)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except KeyboardInterrupt:
        return 130
    print(line)
    _write(result_file, line)
    return EXIT_OK


def _result_file(argv: Sequence[str]) -> str | None:
    for i, word in enumerate(argv):
        if word == "--result-file" and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith("--result-file="):
            return word.split("=", 1)[1]
    return None


def _fail(line: str, code: int, result_file: str | None) -> int:
    print(line, file=sys.stderr)
    _write(result_file, line)
    return code


def _write(path: str | None, line: str) -> None:
    if path is None:
        return
    try:
        with open(path, "w", encoding="utf-8") as file:
            file.write(line + "\n")
    except OSError as exc:
        print(f"flotilla pipeline: cannot write --result-file {path}: {exc.strerror}",
              file=sys.stderr)


def _run(args: argparse.Namespace) -> str:
    """Run the job; its result line."""
    from flotilla.node.archive.urls import normalize_archive_url
    from flotilla.pipeline.source import ArchiveRef
    from flotilla.pipeline.spark import spark_session

    try:
        url = normalize_archive_url(args.archive)
    except ValueError as exc:
        raise PipelineError(f"--archive: {exc}", EXIT_USAGE) from None
    ref = ArchiveRef(url, args.cluster_id, args.s3_endpoint, args.s3_region,
                     **_archive_protection(args))
    if args.job == "snapshot-at":
        from flotilla.pipeline.snapshot_at import prepare, snapshot_at

        if args.exclusive and args.time is None:
            raise PipelineError("--exclusive goes with --time", EXIT_USAGE)
        job = prepare(ref, args.index, args.to_cluster_id, time_ms=args.time,
                      exclusive=args.exclusive, machine=args.state_machine,
                      sequential=args.sequential)
        if args.dry_run:
            return json.dumps(job.describe())
        spark = spark_session(args.master)
        try:
            result = snapshot_at(spark, ref, prepared=job)
        finally:
            spark.stop()
        return result.to_json()
    if args.job == "compact":
        return _compact(args, ref)
    if args.job == "export":
        return _export(args, ref)
    raise PipelineError(f"unknown job {args.job!r}", EXIT_USAGE)


def _archive_protection(args: argparse.Namespace) -> dict[str, Any]:
    """The manifest keys and S3 encryption the flags ask for; bad ones exit 2."""
    from flotilla.node.archive import ManifestKeys, S3Encryption

    try:
        keys = (ManifestKeys.parse(args.archive_signing_key_file)
                if args.archive_signing_key_file else None)
    except ValueError as exc:
        raise PipelineError(f"--archive-signing-key-file: {exc}", EXIT_USAGE) from None
    try:
        encryption = S3Encryption.parse(args.s3_sse, args.s3_sse_kms_key_id)
    except ValueError as exc:
        raise PipelineError(str(exc), EXIT_USAGE) from None
    return {"encryption": encryption, "keys": keys}


def _export(args: argparse.Namespace, ref: Any) -> str:
    from flotilla.pipeline.export import Destination, export, prepare
    from flotilla.pipeline.spark import spark_session

    try:
        dest = Destination.parse(args.to, args.s3_endpoint, args.s3_region)
    except ValueError as exc:
        raise PipelineError(f"--to: {exc}", EXIT_USAGE) from None
    job = prepare(ref, dest, args.format)
    if args.dry_run:
        return json.dumps(job.describe())
    if job.plan is None:  # nothing new (an earlier run's staged files perhaps): no Spark
        return export(None, prepared=job).to_json()
    spark = spark_session(args.master)
    try:
        return export(spark, prepared=job).to_json()
    finally:
        spark.stop()


def _compact(args: argparse.Namespace, ref: Any) -> str:
    from flotilla.pipeline import compact as job
    from flotilla.pipeline.spark import spark_session

    try:
        policy = job.CompactionPolicy(args.min_compaction_lag, args.delete_retention,
                                      args.min_cleanable_dirty_ratio, args.max_compaction_lag)
    except ValueError as exc:
        raise PipelineError(str(exc), EXIT_USAGE) from None
    prepared = job.prepare(ref, policy)
    if args.dry_run or isinstance(prepared.plan, job.Skip):
        return prepared.describe()
    spark = spark_session(args.master)
    try:
        result = job.compact(spark, ref, policy, sequential=args.sequential,
                             prepared=prepared)
    finally:
        spark.stop()
    assert isinstance(result, job.CompactionResult)
    return result.to_json()


if __name__ == "__main__":
    sys.exit(main())
