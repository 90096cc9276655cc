"""The admin token (``--admin-token``) on a real 1-member cluster: admin endpoints refuse a
request without the token, or with a wrong one, with a JSON 401 (before they look at the body);
with the token they work; the key-value API and the read-only endpoints need no token."""

from __future__ import annotations

import pytest

from tests.node.badinput import Canary, assert_error, module_cluster

TOKEN = "s3cret-T0ken-of-24-bytes"

ADMIN = [
    ("POST", "/v1/members", b'{"name": "n7", "peer_url": "http://127.0.0.1:1"}'),
    ("PUT", "/v1/config", b'{"voters": ["n0"]}'),
    ("DELETE", "/v1/members/n0", None),
    ("POST", "/v1/leader", b'{"name": "n0"}'),
    ("POST", "/v1/snapshot", None),
]

WRONG = [
    ({}, "no Authorization header"),
    ({"Authorization": ""}, "no Authorization header"),
    ({"Authorization": "Bearer nope"}, "wrong token"),
    ({"Authorization": f"Bearer {TOKEN}x"}, "wrong token"),
    ({"Authorization": f"Bearer {TOKEN[:-1]}"}, "wrong token"),
    ({"Authorization": "Bearer"}, "wrong token"),
    ({"Authorization": TOKEN}, "scheme"),
    ({"Authorization": f"Basic {TOKEN}"}, "scheme"),
    ({"Authorization": "Bearer \u00ff\u00fe"}, "wrong token"),  # sent as raw bytes 0xff 0xfe
    ({"Authorization": "\u00ff"}, "scheme"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 1, extra_args=["--admin-token", TOKEN])


@pytest.fixture(scope="module")
def canary(cluster):
    canary = Canary(cluster)
    canary.check("before any bad input")
    return canary


def status(cluster):
    return cluster.status("n0")


@pytest.mark.parametrize("method,path,body", ADMIN, ids=[f"{m} {p}" for m, p, _ in ADMIN])
@pytest.mark.parametrize("headers,says", WRONG, ids=[repr(h)[:40] for h, _ in WRONG])
def test_admin_endpoints_without_the_token_are_401(cluster, canary, method, path, body,
                                                   headers, says):
    before = status(cluster)
    with cluster.client("n0", with_token=False) as c:
        resp = c.request(method, path, body, headers=headers)
    assert_error(resp, 401, "unauthorized", [says, "--admin-token"])
    assert resp.headers.get("WWW-Authenticate", "").startswith("Bearer")
    after = status(cluster)
    assert after["config"] == before["config"]
    assert after["snapshot"]["index"] == before["snapshot"]["index"]
    canary.check(f"{method} {path} {headers}")


@pytest.mark.parametrize("method,path", [("POST", "/v1/members"), ("PUT", "/v1/config"),
                                         ("POST", "/v1/leader")])
def test_the_token_is_checked_before_the_body(cluster, canary, method, path):
    with cluster.client("n0", with_token=False) as c:
        assert_error(c.request(method, path, b"{not json"), 401, "unauthorized")
        resp = c.request(method, path, b"{not json",
                         headers={"Authorization": f"Bearer {TOKEN}"})
        assert_error(resp, 400, "bad_request", "JSON")
    canary.check(f"{method} {path} order")


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_admin_endpoints_with_the_token_work(cluster, canary, scheme):
    auth = {"Authorization": f"{scheme} {TOKEN}"}
    with cluster.client("n0", timeout=20, with_token=False) as c:
        resp = c.request("POST", "/v1/snapshot", headers=auth)
        assert resp.status == 200, resp.body
        assert {"index", "term", "bytes", "location"} <= set(resp.json())
        resp = c.request("POST", "/v1/leader", b'{"name": "n0"}', headers=auth)
        assert resp.status == 200 and resp.json()["leader"] == "n0", resp.body
        resp = c.request("PUT", "/v1/config", b'{"voters": ["n0"]}', headers=auth)
        assert resp.status == 200 and resp.json()["config"]["voters"] == ["n0"], resp.body
        assert_error(c.request("DELETE", "/v1/members/nosuch", headers=auth), 404, "not_found")
        assert_error(c.request("DELETE", "/v1/members/n0", headers=auth), 422, None,
                     "last voter")
        assert_error(c.request("POST", "/v1/members", b'{"name": "bad name"}', headers=auth),
                     400, "bad_request")
    canary.check(f"admin with {scheme}")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}])
def test_the_key_value_api_and_read_only_endpoints_need_no_token(cluster, canary, headers):
    with cluster.client("n0", with_token=False) as c:
        assert c.request("PUT", "/v1/kv/open", b"v", headers=headers).status == 200
        assert c.request("GET", "/v1/kv/open", headers=headers).body == b"v"
        assert c.request("GET", "/v1/kv", query={"prefix": "op"}, headers=headers
                         ).json()["keys"] == ["open"]
        assert c.request("DELETE", "/v1/kv/open", headers=headers).json()["deleted"] is True
        for path in ("/v1/status", "/metrics", "/healthz", "/readyz"):
            resp = c.request("GET", path, headers=headers)
            assert resp.status == 200, (path, resp.body)
    canary.check(f"kv with {headers}")
