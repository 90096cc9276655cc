"""Logs of the long-running commands (`flotilla node`, `flotilla operator`) on stderr: text for
people, or JSON for log collectors, at a chosen level.

`--log-format json` writes one JSON object per line with at least `time` (RFC 3339, UTC, ms),
`level`, `logger` and `message`; a traceback rides in the same object (`exception`), so a line
is always one record. kopf's records about a Kubernetes object carry it as `object`
(apiVersion, kind, namespace, name, uid), as kopf's own JSON formatter does. Python warnings
are logged too, and an uncaught exception becomes one last record instead of a page on stderr.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

FORMATS = ("text", "json")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}
# The attributes every LogRecord has: anything else on a record came as `extra=`.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
# kopf's per-object records carry these extras: the object goes out as `object`, the rest not.
_KOPF_EXTRAS = frozenset({"k8s_ref", "k8s_skip", "settings"})


class LogSettingError(ValueError):
    """A bad --log-format or --log-level: the message says what is accepted."""


def parse_format(text: str | None, flag: str = "--log-format") -> str:
    value = (text or "text").strip().lower()
    if value not in FORMATS:
        raise LogSettingError(f"{flag} must be text or json, not {text!r}")
    return value


def parse_level(text: str | None, flag: str = "--log-level") -> str:
    value = (text or "info").strip().lower()
    if value not in LEVELS:
        raise LogSettingError(f"{flag} must be one of {', '.join(LEVELS)}, not {text!r}")
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def __init__(self, fields: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.fields = dict(fields or {})  # added to every record (e.g. the member's name)

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC)
        doc: dict[str, Any] = {
            "time": when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **self.fields,
        }
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, Mapping):
            doc["object"] = {k: v for k, v in ref.items() if v is not None}
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in _KOPF_EXTRAS and key not in doc:
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = record.stack_info
        return json.dumps(doc, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`time level logger: message`; kopf's records about an object name it first."""

    def format(self, record: logging.LogRecord) -> str:
        ref = getattr(record, "k8s_ref", None)
        text = super().format(record)
        if isinstance(ref, Mapping) and ref.get("name"):
            where = f"{ref['namespace']}/{ref['name']}" if ref.get("namespace") else ref["name"]
            head, sep, tail = text.partition(": ")
            text = f"{head}{sep}[{where}] {tail}" if sep else f"[{where}] {text}"
        return text


def configure(log_format: str, level: str, *, prefix: str = "",
              fields: Mapping[str, Any] | None = None) -> None:
    """Send every log record (the root logger's) to stderr in `log_format` at `level`.

    `prefix` goes after the time in text (the member's name); `fields` go into every JSON
    object. Replaces whatever handlers the root logger had, so calling it again is safe."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(fields))
    else:
        head = f"%(asctime)s {prefix} " if prefix else "%(asctime)s "
        handler.setFormatter(TextFormatter(head + "%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    # asyncio's own chatter (slow callbacks, unclosed transports) only when debugging
    logging.getLogger("asyncio").setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
    logging.captureWarnings(True)
    if log_format == "json":
        _log_uncaught()


def _log_uncaught() -> None:
    """An exception nobody caught (a bug) becomes one record, not lines of traceback."""
    crashed = logging.getLogger("flotilla")

    def hook(kind, value, traceback) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, traceback)
            return
        crashed.critical("uncaught exception: %s", value, exc_info=(kind, value, traceback))

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        crashed.critical("uncaught exception in thread %s: %s",
                         args.thread.name if args.thread else "?", args.exc_value,
                         exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    sys.excepthook = hook
    threading.excepthook = thread_hook


def fatal(program: str, message: str, log_format: str = "text") -> None:
    """The one line a command prints before it exits on an expected error: `program: message`
    in text, a record of level error in JSON (so that every line of stderr parses)."""
    if log_format == "json":
        record = logging.makeLogRecord({"name": program.replace(" ", "."), "msg": message,
                                        "levelno": logging.ERROR, "levelname": "ERROR"})
        print(JsonFormatter().format(record), file=sys.stderr)
    else:
        print(f"{program}: {message}", file=sys.stderr)
