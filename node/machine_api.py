"""HTTP for any state machine: `POST /v1/command` and `POST /v1/query` (docs/contract.md,
"The client API"), and the refusal `/v1/kv` gives on a member that runs another machine.

A command is the request body, proposed as it is; the machine's result comes back as JSON. It
takes the path of a key-value write: followers forward it to the leader, and the same limits
and refusals apply (413, 503 overloaded, 507 NOSPACE). Unlike a key-value write it carries no
exactly-once session (the machine's commands are its own), so an answer that does not say
whether the command was applied (a timeout, a lost leader) must not be resent blindly: the
error names that case `outcome_unknown`, and `no_leader` or `overloaded` ones, which are
refused before anything is proposed, are safe to retry.

A query is a JSON request handed to the machine's `query` after the read barrier (linearizable
by default; `?consistency=serializable` answers from local state, as for `/v1/kv`).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .node import Overloaded, Unavailable

if TYPE_CHECKING:
    from .http_api import ClientAPI

log = logging.getLogger(__name__)

#: Exceptions a machine's `query` raises for a request it does not understand (a 400).
BAD_QUERY = (TypeError, ValueError, LookupError)


def _error(status: int, code: str, sentence: str, **headers: str) -> web.Response:
    return web.json_response({"error": sentence, "code": code}, status=status, headers=headers)


class MachineAPI:
    def __init__(self, api: ClientAPI) -> None:
        self.api = api

    @property
    def machine_name(self) -> str:
        return self.api.node.machines.describe()

    def not_kv(self) -> web.Response:
        """What `/v1/kv` answers when the member runs another machine."""
        return _error(409, "not_kv",
                      f"this cluster runs the state machine {self.machine_name}, not the "
                      "key-value machine that /v1/kv serves: send its commands with "
                      "POST /v1/command and its reads with POST /v1/query")

    async def command(self, request: web.Request) -> web.Response:
        node = self.api.node
        body = await request.read()
        if len(body) > node.cfg.max_value_bytes:
            return self.api._too_large(request, len(body))
        if node.leader() is None:
            return _error(503, "no_leader", "no leader is known yet; the command was not "
                          "proposed: retry", **{"Retry-After": "1"})
        try:
            result = await self.api._commit(request, body, body)
        except Overloaded:
            raise  # refused before it was proposed: the usual 503 "overloaded"
        except (TimeoutError, Unavailable) as exc:
            why = "it did not commit in time" if isinstance(exc, TimeoutError) else str(exc)
            return _error(503, "outcome_unknown",
                          f"the command was proposed, but whether it is applied is unknown "
                          f"({why}): it may still be; check with a query before sending it "
                          "again", **{"Retry-After": "1"})
        if isinstance(result, web.Response):  # forwarded to the leader, or refused
            return result
        index, value = result
        return self._answer(value, "apply", "the command was applied, but its result",
                            {"Flotilla-Index": str(index)})

    async def query(self, request: web.Request) -> web.Response:
        node = self.api.node
        body = await request.read()
        try:
            question = json.loads(body)
        except ValueError as exc:
            return _error(400, "bad_request", f"the body must be a JSON request for the state "
                          f"machine ({exc})")
        except RecursionError:
            return _error(400, "bad_request", "the body is not JSON this member will read: "
                          "nested too deeply")
        index = await self.api._consistent(request)
        if isinstance(index, web.Response):
            return index
        try:
            answer = node.machine.query(question)
        except BAD_QUERY as exc:
            return _error(400, "bad_query", f"the state machine {self.machine_name} refused "
                          f"the query: {type(exc).__name__}: {str(exc)[:300]}")
        except Exception as exc:
            log.warning("the state machine %s failed on a query: %s: %s", self.machine_name,
                        type(exc).__name__, exc)
            return _error(500, "query_failed", f"the state machine {self.machine_name} failed "
                          f"on the query: {type(exc).__name__}: {str(exc)[:300]}")
        return self._answer(answer, "query", "the answer", {"Flotilla-Index": str(node.applied)})

    def _answer(self, value: Any, method: str, what: str,
                headers: dict[str, str] | None = None) -> web.Response:
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            return _error(500, "not_json",
                          f"{what} is not JSON: the state machine {self.machine_name} returned "
                          f"a {type(value).__name__} from {method} ({exc}); return lists, "
                          "dicts, strings, numbers, booleans or None", **(headers or {}))
        return web.Response(text=text, content_type="application/json", headers=headers)
