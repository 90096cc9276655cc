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
from typing import Any

import aiohttp
from aiohttp import web
from flotilla.node.consensus import (
    InvalidMembership,
    MembershipChangeInProgress,
    NotLeader,
    ProposalError,
    Role,
    TransferInProgress,
)
from flotilla.node.statemachine.kv import encode_delete, encode_put

from .server import NodeServer, Unavailable
from .transport import MESSAGES_PATH, SNAPSHOT_PATH
from .wire import WireError, decode_batch

log = logging.getLogger(__name__)

PEER_BODY_LIMIT = 64 << 20
REQUEST_TIMEOUT = 10.0
FORWARDED = "Flotilla-Forwarded"


def error(status: int, code: str, sentence: str, **headers: str) -> web.Response:
    return web.json_response({"error": sentence, "code": code}, status=status, headers=headers)


def unavailable(sentence: str) -> web.Response:
    return error(503, "unavailable", sentence, **{"Retry-After": "1"})


# --- peer API ---------------------------------------------------------------------------------


def peer_app(node: NodeServer) -> web.Application:
    async def messages(request: web.Request) -> web.Response:
        body = await request.read()
        try:
            batch = decode_batch(body)
        except WireError as exc:
            return error(400, "bad_message", f"not a Flotilla peer batch: {exc}")
        if batch.cluster_id != node.cfg.cluster_id:
            return error(403, "wrong_cluster",
                         f"this member belongs to cluster {node.cfg.cluster_id!r}, not "
                         f"{batch.cluster_id!r}: check --cluster-id and --initial-cluster")
        node.transport.learn(batch.sender, batch.peer_url, batch.client_url)
        mine = [m for m in batch.messages if m.to == node.name]
        node.deliver(mine)
        return web.Response(status=204)

    async def snapshot(request: web.Request) -> web.Response:
        try:
            batch = decode_batch(bytes.fromhex(request.headers.get("Flotilla-Message", "")))
        except (WireError, ValueError) as exc:
            return error(400, "bad_message", f"snapshot without a valid message header: {exc}")
        if batch.cluster_id != node.cfg.cluster_id:
            return error(403, "wrong_cluster", f"this member belongs to cluster "
                         f"{node.cfg.cluster_id!r}, not {batch.cluster_id!r}")
        if len(batch.messages) != 1 or batch.messages[0].snapshot is None:
            return error(400, "bad_message", "a snapshot request carries one snapshot message")
        node.transport.learn(batch.sender, batch.peer_url, batch.client_url)
        await node.receive_snapshot(batch.messages[0], request.content.iter_chunked(1 << 20))
        return web.Response(status=204)

    app = web.Application(client_max_size=PEER_BODY_LIMIT)
    app.router.add_post(MESSAGES_PATH, messages)
    app.router.add_post(SNAPSHOT_PATH, snapshot)
    return app


# --- client and admin API ----------------------------------------------------------------------


class ClientAPI:
    def __init__(self, node: NodeServer) -> None:
        self.node = node
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.node.cfg.max_value_bytes + 1)
        app.middlewares.append(self._errors)
        r = app.router
        r.add_get("/v1/kv", self.list_keys)
        r.add_put("/v1/kv/{key:.+}", self.put)
        r.add_get("/v1/kv/{key:.+}", self.get)
        r.add_delete("/v1/kv/{key:.+}", self.delete)
        r.add_get("/v1/status", self.status)
        r.add_post("/v1/members", self.add_member)
        r.add_delete("/v1/members/{name}", self.remove_member)
        r.add_put("/v1/config", self.set_config)
        r.add_post("/v1/leader", self.transfer)
        r.add_post("/v1/snapshot", self.snapshot)
        r.add_get("/metrics", self.metrics)
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    @web.middleware
    async def _errors(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return error(413, "too_large", f"the value is larger than the limit of "
                         f"{self.node.cfg.max_value_bytes} bytes (--max-value-bytes)")
        except web.HTTPException as exc:
            if exc.status >= 400:
                return error(exc.status, exc.reason.lower().replace(" ", "_"),
                             f"{exc.reason}: {request.method} {request.path}")
            raise
        except Unavailable as exc:
            return unavailable(str(exc))
        except TimeoutError:
            return unavailable("the cluster did not answer in time; retry")

    # --- helpers -----------------------------------------------------------------------

    def _admin_allowed(self, request: web.Request) -> web.Response | None:
        token = self.node.cfg.admin_token
        if token is None:
            return None
        given = request.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return None
        return error(401, "unauthorized", "admin endpoints need 'Authorization: Bearer <token>' "
                     "with the member's --admin-token")

    async def _forward(self, request: web.Request, body: bytes | None) -> web.Response:
        """Send a request this member cannot serve to the leader, once."""
        if request.headers.get(FORWARDED):
            return unavailable("leadership moved while the request was forwarded; retry")
        url = self.node.leader_client_url()
        if url is None:
            return unavailable("no leader is known yet; retry")
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15))
        headers = {k: v for k, v in request.headers.items()
                   if k.lower().startswith("flotilla-") or k.lower() in ("content-type",
                                                                          "authorization")}
        headers[FORWARDED] = self.node.name
        try:
            async with self.session.request(request.method, url + request.rel_url.raw_path_qs,
                                            data=body, headers=headers) as resp:
                payload = await resp.read()
                keep = {k: v for k, v in resp.headers.items()
                        if k.lower().startswith("flotilla-") or k.lower() in (
                            "content-type", "retry-after")}
                return web.Response(status=resp.status, body=payload, headers=keep)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return unavailable(f"the leader did not answer ({exc.__class__.__name__}); retry")

    async def _commit(self, request: web.Request, command: bytes, body: bytes | None):
        try:
            return await asyncio.wait_for(self.node.propose(command), REQUEST_TIMEOUT)
        except NotLeader:
            return await self._forward(request, body)
        except TransferInProgress as exc:
            return unavailable(str(exc))

    @staticmethod
    def _session(request: web.Request) -> tuple[str | None, int | None] | web.Response:
        client = request.headers.get("Flotilla-Client")
        seq = request.headers.get("Flotilla-Seq")
        if (client is None) != (seq is None):
            return error(400, "bad_request", "Flotilla-Client and Flotilla-Seq go together")
        if seq is None:
            return None, None
        if not client or not seq.isdigit() or int(seq) < 1:
            return error(400, "bad_request", "Flotilla-Seq must be a whole number >= 1 and "
                         "Flotilla-Client non-empty")
        return client, int(seq)

    # --- key-value -----------------------------------------------------------------------

    async def put(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        body = await request.read()
        if len(body) > self.node.cfg.max_value_bytes:
            return error(413, "too_large", f"the value has {len(body)} bytes; the limit is "
                         f"{self.node.cfg.max_value_bytes} (--max-value-bytes)")
        prev = request.query.get("prev_index")
        if prev is not None and (not prev.isdigit()):
            return error(400, "bad_request",
                         f"prev_index must be a whole number >= 0, not {prev!r}")
        session = self._session(request)
        if isinstance(session, web.Response):
            return session
        client, seq = session
        command = encode_put(key, body, ts=int(time.time() * 1000),
                             prev_index=None if prev is None else int(prev),
                             client=client, seq=seq)
        result = await self._commit(request, command, body)
        if isinstance(result, web.Response):
            return result
        return self._write_answer(result)

    async def delete(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        session = self._session(request)
        if isinstance(session, web.Response):
            return session
        client, seq = session
        command = encode_delete(key, ts=int(time.time() * 1000), client=client, seq=seq)
        result = await self._commit(request, command, None)
        if isinstance(result, web.Response):
            return result
        return self._write_answer(result)

    @staticmethod
    def _write_answer(result: dict[str, Any]) -> web.Response:
        headers = {"Flotilla-Index": str(result["index"])}
        err = result.get("error")
        if err == "precondition_failed":
            headers["Flotilla-Mod-Index"] = str(result["mod_index"])
            return web.json_response(
                {"error": f"the key's mod index is {result['mod_index']}, not the prev_index "
                          "given", "code": "precondition_failed"}, status=412, headers=headers)
        if err == "stale_sequence":
            return web.json_response(
                {"error": f"Flotilla-Seq is older than this client's last ({result['last_seq']})"
                          " and its outcome is no longer kept", "code": "stale_sequence"},
                status=409, headers=headers)
        if err is not None:
            return web.json_response({"error": result.get("reason", err), "code": err},
                                     status=400, headers=headers)
        if "deleted" in result:
            return web.json_response({"index": result["index"], "deleted": result["deleted"]},
                                     headers=headers)
        headers["Flotilla-Mod-Index"] = str(result["mod_index"])
        return web.json_response({"index": result["index"]}, headers=headers)

    async def _consistent(self, request: web.Request) -> int | web.Response:
        consistency = request.query.get("consistency", "linearizable")
        if consistency == "serializable":
            return self.node.applied
        if consistency != "linearizable":
            return error(400, "bad_request", "consistency must be linearizable or serializable")
        return await asyncio.wait_for(self.node.read_barrier(), REQUEST_TIMEOUT)

    async def get(self, request: web.Request) -> web.Response:
        index = await self._consistent(request)
        if isinstance(index, web.Response):
            return index
        key = request.match_info["key"]
        found = self.node.sm.get(key)
        applied = str(self.node.applied)
        if found is None:
            return web.json_response({"error": f"key {key!r} not found", "code": "not_found"},
                                     status=404, headers={"Flotilla-Index": applied})
        value, mod_index = found
        return web.Response(body=value, content_type="application/octet-stream",
                            headers={"Flotilla-Index": applied,
                                     "Flotilla-Mod-Index": str(mod_index)})

    async def list_keys(self, request: web.Request) -> web.Response:
        limit = request.query.get("limit")
        if limit is not None and (not limit.isdigit() or int(limit) < 1):
            return error(400, "bad_request", f"limit must be a whole number >= 1, not {limit!r}")
        index = await self._consistent(request)
        if isinstance(index, web.Response):
            return index
        keys = self.node.sm.list(request.query.get("prefix", ""),
                                 None if limit is None else int(limit))
        return web.json_response({"index": self.node.applied, "keys": keys})

    # --- admin ---------------------------------------------------------------------------

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(self.node.status())

    async def _json(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            doc = json.loads(await request.read() or b"{}")
        except ValueError as exc:
            return error(400, "bad_request", f"the body is not JSON: {exc}")
        if not isinstance(doc, dict):
            return error(400, "bad_request", "the body must be a JSON object")
        return doc

    async def _admin(self, request: web.Request, action) -> web.Response:
        denied = self._admin_allowed(request)
        if denied is not None:
            return denied
        doc = await self._json(request) if request.method in ("POST", "PUT") else {}
        if isinstance(doc, web.Response):
            return doc
        if self.node.core.role is not Role.LEADER:
            body = json.dumps(doc).encode() if doc else None
            return await self._forward(request, body)
        try:
            return await asyncio.wait_for(action(doc), 30)
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
            if not isinstance(name, str) or not name or not isinstance(peer_url, str):
                return error(400, "bad_request", 'give {"name": ..., "peer_url": ..., '
                             '"client_url": ...}')
            m = self.node.core.membership
            if name in m.members():
                return error(409, "member_exists", f"{name} is already a member")
            client_url = doc.get("client_url")
            self.node.transport.learn(name, peer_url, client_url if isinstance(client_url, str)
                                      else None)
            index = await self.node.change_membership(m.voters, m.learners | {name},
                                                      {name: peer_url})
            return web.json_response({"index": index, "config": self.node.core.membership
                                      .describe()})
        return await self._admin(request, action)

    async def set_config(self, request: web.Request) -> web.Response:
        async def action(doc):
            voters = doc.get("voters")
            if not isinstance(voters, list) or not voters or not all(
                    isinstance(v, str) for v in voters):
                return error(400, "bad_request", 'give {"voters": ["n1", "n2", ...]}')
            core = self.node.core
            m = core.membership
            target = set(voters)
            for name in target - m.voters:
                if name not in m.learners:
                    return error(422, "not_a_learner", f"{name} must first be added as a "
                                 "learner (POST /v1/members) and catch up")
                pr = core.progress.get(name)
                if pr is None or core.log.committed - pr.match > 1000:
                    return error(422, "not_caught_up", f"learner {name} has not caught up yet "
                                 f"(match {pr.match if pr else 0}, commit "
                                 f"{core.log.committed}); retry when it has")
            await self._until_settled(await self.node.change_membership(
                target, m.learners - target))
            return web.json_response({"config": core.membership.describe()})
        return await self._admin(request, action)

    async def _until_settled(self, index: int) -> None:
        """Wait until the configuration is committed and no longer joint (C_new committed)."""
        core = self.node.core
        while True:
            m = core.membership
            if not m.joint and core.log.membership_index() <= self.node.applied:
                return
            if core.role is not Role.LEADER and core.leader is None:
                raise Unavailable("leadership was lost during the change; check /v1/status")
            await asyncio.sleep(0.01)

    async def remove_member(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]

        async def action(_doc):
            core = self.node.core
            m = core.membership
            if name not in m.members():
                return error(404, "not_found", f"{name} is not a member")
            if name in m.learners:
                await self.node.change_membership(m.voters, m.learners - {name})
            else:
                if m.voters == {name}:
                    return error(422, "invalid_config", "cannot remove the last voter")
                await self._until_settled(await self.node.change_membership(
                    m.voters - {name}, m.learners))
            return web.json_response({"config": core.membership.describe()})
        return await self._admin(request, action)

    async def transfer(self, request: web.Request) -> web.Response:
        async def action(doc):
            target = doc.get("name")
            if not isinstance(target, str):
                return error(400, "bad_request", 'give {"name": "<voter>"}')
            core = self.node.core
            self.node.transfer_leadership(target)
            deadline = time.monotonic() + self.node.cfg.election_timeout_ms / 1000 * 2
            while time.monotonic() < deadline:
                if core.leader == target and core.role is not Role.LEADER:
                    return web.json_response({"leader": target, "term": core.term})
                await asyncio.sleep(0.01)
            return unavailable(f"{target} did not take over in time; check /v1/status")
        return await self._admin(request, action)

    async def snapshot(self, request: web.Request) -> web.Response:
        denied = self._admin_allowed(request)
        if denied is not None:
            return denied
        return web.json_response(await self.node.take_snapshot())

    async def metrics(self, request: web.Request) -> web.Response:
        text = self.node.metrics.render(self.node.core.log.committed, self.node.role())
        return web.Response(text=text, content_type="text/plain")

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        if self.node.ready():
            return web.json_response({"ready": True})
        return error(503, "not_ready", "this member knows no leader yet or is still applying")
