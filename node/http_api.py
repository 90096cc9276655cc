"""HTTP APIs of a member: peer routes (msgpack) and client/admin routes (JSON and raw bytes).

Errors are always `{"error": "<sentence>", "code": "<word>"}` with the contract's status codes;
a bad request never reaches the core or the disk.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import weakref
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

import aiohttp
import yarl
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from flotilla.node.archive import ArchiveError
from flotilla.node.consensus import (
    InvalidMembership,
    MembershipChangeInProgress,
    MessageType,
    NotLeader,
    ProposalError,
    TransferInProgress,
)
from flotilla.node.statemachine.kv import KVStateMachine, encode_delete, encode_put
from flotilla.node.storage import DiskFullError

from . import tls
from .alarms import NoSpace
from .config import MEMBER_NAME, NAME_RULE
from .machine_api import MachineAPI
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .node import Node, Overloaded, Refused, SnapshotRefused, Unavailable
from .transport import (
    CLUSTER_HEADER,
    FRAME_ENTRY_BYTES,
    MESSAGES_PATH,
    PEER_BODY_LIMIT,
    SENDER_HEADER,
    SNAPSHOT_KEY_HEADER,
    SNAPSHOT_PATH,
    SNAPSHOT_SHA_HEADER,
    SNAPSHOT_SIZE_HEADER,
    STREAM_PATH,
)
from .wire import Batch, WireError, decode_batch

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 10.0
#: How long a follower waits for a new leader's client URL to be committed before it turns a
#: request it would forward away with 503.
LEADER_URL_WAIT = 2.0
FORWARDED = "Flotilla-Forwarded"
KV_PREFIX = "/v1/kv/"
#: Longest key, in bytes of UTF-8. Even fully percent-encoded (3 characters a byte) such a key
#: fits in a request line of MAX_URL_BYTES, so every valid key can be sent.
MAX_KEY_BYTES = 4096
MAX_URL_BYTES = 16384
#: Largest prev_index, Flotilla-Seq and limit (a signed 64-bit integer, as in the log).
MAX_WHOLE = (1 << 63) - 1
#: A refusal on the peer port is logged at most once per sender and reason in this many s.
REFUSAL_LOG_INTERVAL = 30.0


def _route(request: web.Request) -> str:
    """The pattern of the route that took `request` (`/v1/kv/{key}`), "unmatched" for none."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def error(status: int, code: str, sentence: str, **headers: str) -> web.Response:
    return web.json_response({"error": sentence, "code": code}, status=status, headers=headers)


def unavailable(sentence: str) -> web.Response:
    return error(503, "unavailable", sentence, **{"Retry-After": "1"})


def bad_request(sentence: str) -> web.Response:
    return error(400, "bad_request", sentence)


def refusal(exc: BaseException) -> tuple[int, str, str, dict[str, str]] | None:
    """(status, code, sentence, headers) of the error answering a request that failed with
    `exc`, for the failures a member expects; None for anything else (a 500)."""
    if isinstance(exc, Overloaded):
        return 503, "overloaded", str(exc), {"Retry-After": "1"}
    if isinstance(exc, (NoSpace, DiskFullError)):  # 507 Insufficient Storage (RFC 4918)
        return 507, "no_space", str(exc), {}
    if isinstance(exc, (Unavailable, TransferInProgress)):
        return 503, "unavailable", str(exc), {"Retry-After": "1"}
    if isinstance(exc, TimeoutError):
        return (503, "unavailable", "the cluster did not answer in time; retry",
                {"Retry-After": "1"})
    return None


JSON_TYPE = "application/json; charset=utf-8"


def write_outcome(result: dict[str, Any]) -> tuple[int, bytes, dict[str, str]]:
    """A committed PUT or DELETE's answer from the machine's result: status, JSON body and
    headers (Content-Type aside, always JSON_TYPE)."""
    headers = {"Flotilla-Index": str(result["index"])}
    err = result.get("error")
    if err == "precondition_failed":
        headers["Flotilla-Mod-Index"] = str(result["mod_index"])
        doc = {"error": f"the key's mod index is {result['mod_index']}, not the prev_index "
                        "given", "code": "precondition_failed"}
        return 412, json.dumps(doc).encode(), headers
    if err == "stale_sequence":
        doc = {"error": f"Flotilla-Seq is older than this client's last ({result['last_seq']})"
                        " and its outcome is no longer kept", "code": "stale_sequence"}
        return 409, json.dumps(doc).encode(), headers
    if err is not None:
        doc = {"error": result.get("reason", err), "code": err}
        return 400, json.dumps(doc).encode(), headers
    if "deleted" in result:
        doc = {"index": result["index"], "deleted": result["deleted"]}
        return 200, json.dumps(doc).encode(), headers
    headers["Flotilla-Mod-Index"] = str(result["mod_index"])
    # json.dumps's bytes without its encoder: every write is answered here
    return 200, b'{"index": %d}' % result["index"], headers


CUT_SHORT = "the connection closed before the whole request arrived"


def unexpected(method: str, path: str, exc: BaseException) -> tuple[int, str, str, dict[str, str]]:
    """The last resort of every error path (both ports' middlewares, the client lane): never
    a bare 500 or a traceback. A 500 is logged with its traceback."""
    if isinstance(exc, ConnectionResetError):
        return 400, "bad_request", CUT_SHORT, {}
    log.error("%s %s failed", method, path, exc_info=exc)
    return 500, "internal", f"this member failed on {method} {path}; its log says why", {}


def _unexpected(request: web.Request, exc: Exception) -> web.Response:
    status, code, sentence, headers = unexpected(request.method, request.path, exc)
    return error(status, code, sentence, **headers)


def _http_exception(request: web.Request, exc: web.HTTPException) -> web.Response:
    """aiohttp's own refusals (no route, wrong method, unreadable request) as JSON errors."""
    where = f"{request.method} {request.path}"
    if exc.status == 404:
        return error(404, "not_found", f"there is no endpoint {where}")
    if exc.status == 405:
        allowed = sorted(getattr(exc, "allowed_methods", None) or ())
        hint = f"; use {' or '.join(allowed)}" if allowed else ""
        return error(405, "method_not_allowed",
                     f"{request.method} is not allowed on {request.path}{hint}",
                     Allow=", ".join(allowed))
    text = (exc.text or "").strip()
    detail = text if text and not text.startswith(f"{exc.status}:") else exc.reason
    return error(exc.status, exc.reason.lower().replace(" ", "_"), f"{where}: {detail}")


def _whole(text: str, what: str, minimum: int) -> int | web.Response:
    """A whole number written in ASCII digits, from `minimum` to MAX_WHOLE, or a 400."""
    if text.isascii() and text.isdigit() and len(text) <= 19 and minimum <= int(text) <= MAX_WHOLE:
        return int(text)
    return bad_request(f"{what} must be a whole number from {minimum} to {MAX_WHOLE}, "
                       f"not {text[:40]!r}")


def _query_whole(request: web.Request, name: str, minimum: int) -> int | web.Response | None:
    values = request.query.getall(name, [])
    if not values:
        return None
    if len(values) > 1:
        return bad_request(f"{name} is given {len(values)} times; give it once")
    return _whole(values[0], name, minimum)


def _url_problem(url: Any, what: str) -> str | None:
    """Why `url` is not an http(s) URL of a member (None when it is one)."""
    if not isinstance(url, str) or not url:
        return f"{what} must be a URL such as http://10.0.0.1:2380"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        parts = None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
            or parts.query or parts.fragment):
        return f"{what} must be an http(s) URL with a host, such as http://10.0.0.1:2380, " \
               f"not {url[:200]!r}"
    return None


class _OneLineBadRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (random bytes, a TLS hello, a bad header) at
    ERROR with a traceback; it is the client's mistake, so one WARNING line says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500:
            lines = [ln.strip() for ln in str(exc.message).splitlines() if ln.strip()]
            said = record.getMessage()
            record.msg = "%s: refused a malformed HTTP request (%s)"
            record.args = (said, lines[0] if lines else exc.code)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = record.exc_text = None
        return True


def _quiet_bad_requests() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _OneLineBadRequests) for f in server_log.filters):
        server_log.addFilter(_OneLineBadRequests())


_last_refusal_logged: dict[tuple[str, str], float] = {}


def _log_refusal(sender: str, reason: str, message: str, *args: Any) -> None:
    """Warn about a refused peer request, at most once per REFUSAL_LOG_INTERVAL per sender
    and reason: a misconfigured peer retries many times a second."""
    now = time.monotonic()
    key = (sender, reason)
    if now - _last_refusal_logged.get(key, -REFUSAL_LOG_INTERVAL) >= REFUSAL_LOG_INTERVAL:
        _last_refusal_logged[key] = now
        if len(_last_refusal_logged) > 1000:
            _last_refusal_logged.clear()
            _last_refusal_logged[key] = now
        log.warning(message, *args)


@web.middleware
async def _peer_errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 413:
            return error(413, "too_large", f"a peer request may carry at most "
                         f"{PEER_BODY_LIMIT} bytes")
        return _http_exception(request, exc)
    except Exception as exc:
        return _unexpected(request, exc)


# --- peer API ---------------------------------------------------------------------------------


def peer_body_limit(max_value_bytes: int) -> int:
    """The largest peer body or frame a member takes: a few MiB, or enough for one entry of the
    largest value a client may write beside a full frame."""
    return max(PEER_BODY_LIMIT, FRAME_ENTRY_BYTES + 2 * max_value_bytes + (1 << 20))


#: A batch body larger than this is decoded in a worker thread, so the loop keeps serving.
DECODE_INLINE_BYTES = 256 << 10


async def _decode(body: bytes, *, snapshot: bool = False) -> Batch:
    if len(body) > DECODE_INLINE_BYTES:
        return await asyncio.to_thread(decode_batch, body, snapshot=snapshot)
    return decode_batch(body, snapshot=snapshot)


def peer_app(node: Node) -> web.Application:
    limit = peer_body_limit(node.cfg.max_value_bytes)
    cluster_id = node.cfg.cluster_id
    authenticated = node.cfg.peer_cert_file is not None
    client_urls = node.transport.client_urls  # from the committed configuration only

    def admit(request: web.Request) -> str | web.Response:
        """Who sends this request, from its headers alone, before a byte of its body is read:
        the sender of the right cluster, named by the connection's certificate (with TLS), and
        a member. Anything else is refused without creating any state for the sender."""
        theirs = request.headers.get(CLUSTER_HEADER)
        sender = request.headers.get(SENDER_HEADER)
        if theirs != cluster_id:
            _log_refusal(str(request.remote), "wrong_cluster", "refused a peer request from %s "
                         "(%s): it carries cluster id %r, this member's is %r (check "
                         "--cluster-id and --initial-cluster)", sender, request.remote, theirs,
                         cluster_id)
            return error(403, "wrong_cluster",
                         f"this member belongs to cluster {cluster_id!r}, not {theirs!r}: check "
                         f"--cluster-id and --initial-cluster")
        if not sender or len(sender) > 63:
            return error(400, "bad_message", f"a peer request names its sender in {SENDER_HEADER}")
        if authenticated:
            names = tls.names(request.transport.get_extra_info("peercert")
                              if request.transport is not None else None)
            if sender not in names:
                _log_refusal(str(request.remote), "impostor", "refused a peer request from %s "
                             "in the name of %r: its certificate names %s", request.remote,
                             sender, sorted(names) or "nobody")
                return error(403, "not_authenticated",
                             f"the connection's certificate names {sorted(names)}, not the "
                             f"sender {sender!r}: each member dials with its own certificate")
        if not node.accepts_peer(sender):
            _log_refusal(sender[:63], "not_a_member", "refused a peer request from %r at %s: "
                         "not a member of this cluster's configuration", sender, request.remote)
            return error(403, "not_a_member", f"{sender!r} is not a member of this cluster")
        return sender

    def heard(batch: Batch) -> None:
        """A member that knows no configuration yet (it started empty, to be added) learns how
        to answer whoever adds it from that peer's batch; every other member dials only the
        URLs of its flags and of the committed configuration. With TLS, the leader also takes
        the client URL a member reports of itself, to commit it to the configuration (as
        etcd's members publish their own attributes); without TLS, where anyone could speak
        in a member's name, only each leader's own client URL is committed."""
        if not node.knows_configuration():
            node.heard_peer_url(batch.sender, batch.peer_url)
        elif (authenticated  # the sender is who its certificate says: it speaks of itself
              and batch.client_url != client_urls.get(batch.sender)  # usually it is known
              and not _url_problem(batch.client_url, "client_url")):
            node.heard_client_url(batch.sender, batch.client_url.rstrip("/"))

    def same_sender(batch: Batch, sender: str) -> str | None:
        if batch.cluster_id != cluster_id:
            return f"a batch of cluster {batch.cluster_id!r}"
        if batch.sender != sender:
            return f"a batch in the name of {batch.sender!r} on {sender!r}'s connection"
        return None

    async def messages(request: web.Request) -> web.Response:
        sender = admit(request)
        if isinstance(sender, web.Response):
            return sender
        declared = request.content_length
        if declared is not None and declared > limit:
            _log_refusal(sender, "too_large", "refused a peer batch of %d bytes from %s: the "
                         "limit is %d", declared, sender, limit)
            return error(413, "too_large", f"a peer batch may carry at most {limit} bytes, not "
                         f"{declared}")
        body = await request.read()  # within the connection's body deadline (deadlines.py)
        try:
            batch = await _decode(body)
        except WireError as exc:
            _log_refusal(sender, "bad_message", "refused a peer request from %s at %s (%d "
                         "bytes): %s", sender, request.remote, len(body), exc)
            return error(400, "bad_message", f"not a Flotilla peer batch: {exc}")
        wrong = same_sender(batch, sender)
        if wrong is not None:
            _log_refusal(sender, "wrong_sender", "refused %s from %s", wrong, request.remote)
            return error(403, "wrong_sender", f"refused {wrong}")
        heard(batch)
        name = node.name
        node.deliver([m for m in batch.messages if m.to == name])
        return web.Response(status=204)

    async def stream(request: web.Request) -> web.StreamResponse:
        """A peer's persistent stream: one binary frame per batch, for as long as it lives."""
        sender = admit(request)
        if isinstance(sender, web.Response):
            return sender
        ws = web.WebSocketResponse(max_msg_size=limit, compress=False)
        await ws.prepare(request)
        streams.add(ws)
        name = node.name
        async for msg in ws:
            if msg.type is not aiohttp.WSMsgType.BINARY:
                if msg.type is aiohttp.WSMsgType.ERROR:
                    _log_refusal(sender, "stream_error", "stream from %s failed: %s", sender,
                                 ws.exception())
                    break
                continue
            try:
                batch = await _decode(msg.data)
                wrong = same_sender(batch, sender)
                if wrong is not None:
                    raise WireError(wrong)
            except WireError as exc:
                _log_refusal(sender, "bad_message", "closing the stream from %s: %s", sender,
                             exc)
                await ws.close(code=aiohttp.WSCloseCode.POLICY_VIOLATION,
                               message=str(exc)[:120].encode())
                break
            heard(batch)
            node.deliver([m for m in batch.messages if m.to == name])
        return ws

    async def snapshot(request: web.Request) -> web.Response:
        sender = admit(request)
        if isinstance(sender, web.Response):
            return sender
        try:
            batch = decode_batch(bytes.fromhex(request.headers.get("Flotilla-Message", "")),
                                 snapshot=True)
        except (WireError, ValueError) as exc:
            return error(400, "bad_message", f"snapshot without a valid message header: {exc}")
        wrong = same_sender(batch, sender)
        if wrong is not None:
            return error(403, "wrong_sender", f"refused {wrong}")
        if (len(batch.messages) != 1 or batch.messages[0].snapshot is None
                or batch.messages[0].type is not MessageType.SNAPSHOT):
            return error(400, "bad_message", "a snapshot request carries one snapshot message")
        if batch.messages[0].to != node.name:
            return error(400, "bad_message", f"this snapshot is for {batch.messages[0].to!r}; "
                         f"this member is {node.name!r}")
        heard(batch)
        key = request.headers.get(SNAPSHOT_KEY_HEADER)
        if key is not None:
            sha256 = request.headers.get(SNAPSHOT_SHA_HEADER, "")
            size = request.headers.get(SNAPSHOT_SIZE_HEADER, "")
            if not size.isdigit() or not sha256:
                return error(400, "bad_message", f"an archived snapshot reference needs "
                             f"{SNAPSHOT_SHA_HEADER} and {SNAPSHOT_SIZE_HEADER}")
            try:
                await node.receive_archived_snapshot(batch.messages[0], key, sha256, int(size))
            except ArchiveError as exc:
                return error(409, "archive_unavailable", f"cannot fetch {key} from the "
                             f"archive: {exc}; stream the snapshot instead")
            return web.Response(status=204)
        try:
            await node.receive_snapshot(batch.messages[0], request.content.iter_chunked(1 << 20))
        except SnapshotRefused as exc:
            _log_refusal(sender, "bad_snapshot", "refused a snapshot from %s: %s", sender, exc)
            return error(400, "bad_snapshot", str(exc))
        return web.Response(status=204)

    async def close_streams(_: web.Application) -> None:
        """The member is stopping: its peers' streams end now (going away), so the port
        closes at once instead of waiting for each peer to notice."""
        for ws in list(streams):
            await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"member stopping")

    streams: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()
    _quiet_bad_requests()
    app = web.Application(client_max_size=limit, middlewares=[_peer_errors])
    app.router.add_post(MESSAGES_PATH, messages)
    app.router.add_post(SNAPSHOT_PATH, snapshot)
    app.router.add_get(STREAM_PATH, stream)
    app.on_shutdown.append(close_streams)
    return app


#: The HTTP status of each reason `Node` refuses an admin request for (node.Refused).
REFUSALS = {"member_exists": 409, "peer_url_exists": 409, "not_a_learner": 422,
            "not_caught_up": 422, "not_found": 404, "invalid_config": 422}


def public_status(doc: dict[str, Any]) -> dict[str, Any]:
    """`/v1/status` for a caller without the admin token: what a client needs to find the
    leader and judge freshness, without what would help someone pose as a peer (the cluster
    id, peer URLs) or reach the archive."""
    shown = {k: v for k, v in doc.items() if k not in ("cluster_id", "archive", "members")}
    shown["members"] = {name: {k: v for k, v in member.items() if k != "peer_url"}
                        for name, member in doc.get("members", {}).items()}
    shown["redacted"] = ["cluster_id", "archive", "members.*.peer_url"]
    return shown


# --- client and admin API ----------------------------------------------------------------------


class ClientAPI:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.session: aiohttp.ClientSession | None = None
        self.machine = MachineAPI(self)

    def app(self) -> web.Application:
        _quiet_bad_requests()
        app = web.Application(client_max_size=self.node.cfg.max_value_bytes + 1,
                              handler_args={"max_line_size": MAX_URL_BYTES})
        app.middlewares.append(self._errors)
        routes = [
            ("GET", "/v1/kv", self.list_keys),
            *((method, KV_PREFIX, self.empty_key) for method in ("PUT", "GET", "DELETE")),
            ("PUT", KV_PREFIX + r"{key:[\s\S]+}", self.put),
            ("GET", KV_PREFIX + r"{key:[\s\S]+}", self.get),
            ("DELETE", KV_PREFIX + r"{key:[\s\S]+}", self.delete),
            ("GET", "/v1/status", self.status),
            ("POST", "/v1/members", self.add_member),
            ("DELETE", "/v1/members/{name}", self.remove_member),
            ("PUT", "/v1/config", self.set_config),
            ("POST", "/v1/leader", self.transfer),
            ("POST", "/v1/snapshot", self.snapshot),
            ("POST", "/v1/command", self.machine.command),
            ("POST", "/v1/query", self.machine.query),
            ("GET", "/metrics", self.metrics),
            ("GET", "/healthz", self.healthz),
            ("GET", "/readyz", self.readyz),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, path, handler, expect_handler=self._expect)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    def _too_large(self, request: web.Request, size: int | None) -> web.Response:
        limit = self.node.cfg.max_value_bytes
        what = "the value" if request.path.startswith(KV_PREFIX) else "the request body"
        has = f"has {size} bytes" if size is not None else "is larger than that"
        return error(413, "too_large", f"{what} {has}; the limit is {limit} bytes "
                     "(--max-value-bytes)")

    async def _expect(self, request: web.Request) -> web.Response | None:
        """Answer `Expect: 100-continue` before any body is sent: 413 at once for a declared
        body over the limit, so the client never sends it, else `100 Continue`. (aiohttp's
        default handler invites every body, the oversized ones included.)"""
        if request.version < aiohttp.HttpVersion11:
            return None  # HTTP/1.0 has no interim responses: the expectation is ignored
        expect = request.headers.get("Expect", "")
        if expect.lower() != "100-continue":
            return error(417, "expectation_failed",
                         f"Expect: {expect[:40]!r} is not understood; only 100-continue is")
        declared = request.content_length
        if declared is not None and declared > self.node.cfg.max_value_bytes:
            refused = self._too_large(request, declared)
            # The client may send the body anyway after a while: end the connection rather
            # than read megabytes we refused, or take them for the next request.
            refused.force_close()
            return refused
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the interim line is not part of the response
        return None

    @web.middleware
    async def _errors(self, request: web.Request, handler) -> web.StreamResponse:
        """Every answer, timed by method, route pattern and status (a metric)."""
        started = time.perf_counter()
        response = await self._answer(request, handler)
        self.node.metrics.request(request.method, _route(request), response.status,
                                  time.perf_counter() - started)
        return response

    async def _answer(self, request: web.Request, handler) -> web.StreamResponse:
        declared = request.content_length
        if declared is not None and declared > self.node.cfg.max_value_bytes:
            return self._too_large(request, declared)  # before reading a byte of it
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return self._too_large(request, None)
        except web.HTTPException as exc:
            if exc.status >= 400:
                return _http_exception(request, exc)
            raise
        except Exception as exc:
            status, code, sentence, headers = (
                refusal(exc) or unexpected(request.method, request.path, exc))
            return error(status, code, sentence, **headers)

    # --- helpers -----------------------------------------------------------------------

    def _admin_allowed(self, request: web.Request) -> web.Response | None:
        """None when the request carries the admin token, else the 401 to answer. There is
        always a token (`Node.open` generates one when --admin-token is not given)."""
        token = self.node.cfg.admin_token
        given = request.headers.get("Authorization", "")
        scheme, _, credentials = given.strip().partition(" ")
        # Header text is decoded with surrogateescape: non-UTF-8 bytes must not become a 500.
        if token is not None and scheme.lower() == "bearer" and hmac.compare_digest(
                credentials.strip().encode("utf-8", "surrogateescape"),
                token.encode("utf-8", "surrogateescape")):
            return None
        why = ("has no Authorization header" if not given else
               "carries a wrong token" if scheme.lower() == "bearer" else
               f"uses the {scheme[:20]!r} scheme, not Bearer")
        generated = self.node.admin_token_file
        which = ("the member's --admin-token" if generated is None else
                 f"the token in {generated} on the member's host (it was started without "
                 "--admin-token)")
        return error(401, "unauthorized", f"the request {why}: admin endpoints need "
                     f"'Authorization: Bearer <token>' with {which}",
                     **{"WWW-Authenticate": 'Bearer realm="flotilla"'})

    async def _forward(self, request: web.Request, body: bytes | None) -> web.Response:
        """Send a request this member cannot serve to the leader, once."""
        if request.headers.get(FORWARDED):
            return unavailable("leadership moved while the request was forwarded; retry")
        url = self.node.leader_client_url()
        if url is None and self.node.leader() is not None:
            # A new leader's client URL reaches the others through the log a moment after its
            # election: wait for it rather than turn the client away.
            url = await self.node.wait_leader_client_url(LEADER_URL_WAIT)
        if url is None:
            return unavailable("no leader is known yet; retry")
        if self.session is None:
            context = self.node.tls.forward_client
            self.session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=15),
                connector=aiohttp.TCPConnector(ssl=context if context is not None else True))
        headers = {k: v for k, v in request.headers.items()
                   if k.lower().startswith("flotilla-") or k.lower() in ("content-type",
                                                                          "authorization")}
        headers[FORWARDED] = self.node.name
        try:
            # encoded=True: the path goes on exactly as it came. Re-parsed, yarl would resolve
            # dot segments and decode escapes, so /v1/kv/a/../b would write the key "b".
            target = yarl.URL(url + request.rel_url.raw_path_qs, encoded=True)
            async with self.session.request(request.method, target, data=body,
                                            headers=headers) as resp:
                payload = await resp.read()
                keep = {k: v for k, v in resp.headers.items()
                        if k.lower().startswith("flotilla-") or k.lower() in (
                            "content-type", "retry-after")}
                return web.Response(status=resp.status, body=payload, headers=keep)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return unavailable(f"the leader did not answer ({exc.__class__.__name__}); retry")

    async def _commit(self, request: web.Request, command: bytes, body: bytes | None):
        """`(index, result)` of the command, or the leader's answer when this member
        forwarded the request. TimeoutError after the runtime's PROPOSAL_TIMEOUT_S."""
        try:
            return await self.node.propose(command)
        except NotLeader:
            return await self._forward(request, body)

    @staticmethod
    def _session(request: web.Request) -> tuple[str | None, int | None] | web.Response:
        client = request.headers.get("Flotilla-Client")
        seq = request.headers.get("Flotilla-Seq")
        if (client is None) != (seq is None):
            return error(400, "bad_request", "Flotilla-Client and Flotilla-Seq go together")
        if seq is None:
            return None, None
        if not client:
            return bad_request("Flotilla-Client must not be empty")
        number = _whole(seq, "Flotilla-Seq", 1)
        if isinstance(number, web.Response):
            return number
        return client, number

    @staticmethod
    def _key(request: web.Request) -> str | web.Response:
        """The key of /v1/kv/{key}: percent-decoded, UTF-8, 1 to MAX_KEY_BYTES bytes."""
        raw = request.rel_url.raw_path
        if raw.startswith(KV_PREFIX):
            try:  # strictly, where aiohttp would keep an invalid escape as literal text
                key = unquote_to_bytes(raw[len(KV_PREFIX):]).decode("utf-8")
            except UnicodeDecodeError:
                return bad_request("the key is not valid UTF-8 once percent-decoded")
        else:
            key = request.match_info.get("key", "")
        if not key:
            return bad_request("the key is empty: use /v1/kv/{key}")
        size = len(key.encode("utf-8", "surrogatepass"))
        if size > MAX_KEY_BYTES:
            return bad_request(f"the key has {size} bytes; the limit is {MAX_KEY_BYTES}")
        return key

    async def empty_key(self, request: web.Request) -> web.Response:
        return bad_request("the key is empty: use /v1/kv/{key}")

    # --- key-value -----------------------------------------------------------------------

    async def put(self, request: web.Request) -> web.Response:
        if not isinstance(self.node.machine, KVStateMachine):
            return self.machine.not_kv()
        key = self._key(request)
        if isinstance(key, web.Response):
            return key
        prev = _query_whole(request, "prev_index", 0)
        if isinstance(prev, web.Response):
            return prev
        body = await request.read()
        if len(body) > self.node.cfg.max_value_bytes:
            return self._too_large(request, len(body))
        session = self._session(request)
        if isinstance(session, web.Response):
            return session
        client, seq = session
        command = encode_put(key, body, ts=int(time.time() * 1000), prev_index=prev,
                             client=client, seq=seq)
        committed = await self._commit(request, command, body)
        if isinstance(committed, web.Response):
            return committed
        return self._write_answer(committed[1])

    async def delete(self, request: web.Request) -> web.Response:
        if not isinstance(self.node.machine, KVStateMachine):
            return self.machine.not_kv()
        key = self._key(request)
        if isinstance(key, web.Response):
            return key
        session = self._session(request)
        if isinstance(session, web.Response):
            return session
        client, seq = session
        command = encode_delete(key, ts=int(time.time() * 1000), client=client, seq=seq)
        committed = await self._commit(request, command, None)
        if isinstance(committed, web.Response):
            return committed
        return self._write_answer(committed[1])

    @staticmethod
    def _write_answer(result: dict[str, Any]) -> web.Response:
        status, body, headers = write_outcome(result)
        headers["Content-Type"] = JSON_TYPE
        return web.Response(status=status, body=body, headers=headers)

    async def _consistent(self, request: web.Request) -> int | web.Response:
        given = request.query.getall("consistency", [])
        consistency = given[0] if len(given) == 1 else "linearizable"
        if len(given) > 1:
            return bad_request(f"consistency is given {len(given)} times; give it once")
        if consistency == "serializable":
            return self.node.applied
        if consistency != "linearizable":
            return bad_request(f"consistency must be linearizable or serializable, not "
                               f"{consistency[:40]!r}")
        async with asyncio.timeout(REQUEST_TIMEOUT):
            return await self.node.read_barrier()

    async def get(self, request: web.Request) -> web.Response:
        if not isinstance(self.node.machine, KVStateMachine):
            return self.machine.not_kv()
        key = self._key(request)
        if isinstance(key, web.Response):
            return key
        index = await self._consistent(request)
        if isinstance(index, web.Response):
            return index
        found = self.node.machine.get(key)
        applied = str(self.node.applied)
        if found is None:
            return web.json_response({"error": f"key {key!r} not found", "code": "not_found"},
                                     status=404, headers={"Flotilla-Index": applied})
        value, mod_index = found
        return web.Response(body=value, content_type="application/octet-stream",
                            headers={"Flotilla-Index": applied,
                                     "Flotilla-Mod-Index": str(mod_index)})

    async def list_keys(self, request: web.Request) -> web.Response:
        if not isinstance(self.node.machine, KVStateMachine):
            return self.machine.not_kv()
        limit = _query_whole(request, "limit", 1)
        if isinstance(limit, web.Response):
            return limit
        prefixes = request.query.getall("prefix", [])
        if len(prefixes) > 1:
            return bad_request(f"prefix is given {len(prefixes)} times; give it once")
        index = await self._consistent(request)
        if isinstance(index, web.Response):
            return index
        keys = self.node.machine.list(prefixes[0] if prefixes else "", limit)
        return web.json_response({"index": self.node.applied, "keys": keys})

    # --- admin ---------------------------------------------------------------------------

    async def status(self, request: web.Request) -> web.Response:
        doc = self.node.status().to_json()
        if self._admin_allowed(request) is not None:
            doc = public_status(doc)
        return web.json_response(doc)

    async def _json(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            doc = json.loads(await request.read() or b"{}")
        except ValueError as exc:
            return bad_request(f"the body is not JSON: {exc}")
        except RecursionError:
            return bad_request("the body is not JSON this member will read: nested too deeply")
        if not isinstance(doc, dict):
            return bad_request(f"the body must be a JSON object, not a {type(doc).__name__}")
        return doc

    async def _admin(self, request: web.Request, action) -> web.Response:
        denied = self._admin_allowed(request)
        if denied is not None:
            return denied
        doc = await self._json(request) if request.method in ("POST", "PUT") else {}
        if isinstance(doc, web.Response):
            return doc
        if not self.node.is_leader():
            body = json.dumps(doc).encode() if doc else None
            return await self._forward(request, body)
        try:
            return await asyncio.wait_for(action(doc), 30)
        except Refused as exc:
            return error(REFUSALS[exc.code], exc.code, str(exc))
        except MembershipChangeInProgress as exc:
            return error(409, "change_in_progress", str(exc))
        except InvalidMembership as exc:
            return error(422, "invalid_config", str(exc))
        except NotLeader:
            return await self._forward(request, json.dumps(doc).encode())
        except ProposalError as exc:
            return unavailable(str(exc))

    async def add_member(self, request: web.Request) -> web.Response:
        async def action(doc):
            name, peer_url = doc.get("name"), doc.get("peer_url")
            client_url = doc.get("client_url")
            if not isinstance(name, str) or not MEMBER_NAME.fullmatch(name):
                return bad_request('give {"name": ..., "peer_url": ..., "client_url": ...} where '
                                   f"name is {NAME_RULE}, not {str(name)[:80]!r}")
            problem = _url_problem(peer_url, "peer_url") or (
                None if client_url is None else _url_problem(client_url, "client_url"))
            if problem:
                return bad_request(problem)
            index, config = await self.node.add_learner(name, peer_url, client_url)
            return web.json_response({"index": index, "config": config})
        return await self._admin(request, action)

    async def set_config(self, request: web.Request) -> web.Response:
        async def action(doc):
            voters = doc.get("voters")
            if not isinstance(voters, list) or not voters or not all(
                    isinstance(v, str) and v for v in voters):
                return bad_request('give {"voters": ["n1", "n2", ...]}: a non-empty list of '
                                   "member names")
            config = await self.node.set_voters(frozenset(voters))
            return web.json_response({"config": config})
        return await self._admin(request, action)

    async def remove_member(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]

        async def action(_doc):
            return web.json_response({"config": await self.node.remove_member(name)})
        return await self._admin(request, action)

    async def transfer(self, request: web.Request) -> web.Response:
        async def action(doc):
            target = doc.get("name")
            if not isinstance(target, str) or not target:
                return bad_request('give {"name": "<voter>"}')
            leader, term = await self.node.transfer_leadership(
                target, timeout=self.node.cfg.election_timeout_ms / 1000 * 2)
            return web.json_response({"leader": leader, "term": term})
        return await self._admin(request, action)

    async def snapshot(self, request: web.Request) -> web.Response:
        denied = self._admin_allowed(request)
        if denied is not None:
            return denied
        try:
            doc = await self.node.take_snapshot()
        except RuntimeError as exc:  # the store and the machine take one snapshot at a time
            return unavailable(f"a snapshot is already being written; retry shortly ({exc})")
        archiver = self.node.archiver
        if archiver is not None:
            try:
                location = await archiver.ship_now(doc["index"], doc["term"])
            except ArchiveError as exc:
                return error(503, "archive_unavailable",
                             f"the snapshot at index {doc['index']} was written here but not "
                             f"shipped to {archiver.cluster.url} ({exc}); it will be shipped "
                             "when the archive answers", **{"Retry-After": "5"})
            if location is not None:
                doc["location"] = location
        return web.json_response(doc)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.node.render_metrics(),
                            headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def healthz(self, request: web.Request) -> web.Response:
        if self.node.fatal is not None:
            return error(503, "failed", f"this member's main loop failed and it is stopping: "
                         f"{self.node.fatal}")
        return web.json_response({"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        if self.node.ready():
            return web.json_response({"ready": True})
        return error(503, "not_ready", "this member knows no leader yet or is still applying")
