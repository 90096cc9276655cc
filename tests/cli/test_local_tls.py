"""`flotilla up --tls`: a local cluster with TLS on both ports, from a CA it makes under DIR/tls/,
and every command against it as a user runs them (subprocesses, real members).

One cluster serves the stories in order: what `up --tls` writes (files, modes, certificates),
kv and status through --dir, --endpoints with --cacert (and what a wrong CA or a plain http://
URL gets), scale 3 -> 4 -> 3 with a certificate issued for the new member, down and up again.
"""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from flotilla.node.tls import Issued, issue, make_ca

from flotilla import local
from flotilla.client import Client, TLSFailure
from flotilla.local import LocalCluster
from tests.cli.conftest import FAST, FAST_FLAGS, ok, tear_down, text
from tests.harness.certs import TestCA
from tests.harness.cli import flotilla
from tests.harness.fixtures import require_node


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _check_member_certificate(tls_dir: Path, name: str) -> None:
    """NAME.crt and NAME.key are 0600; the CA signed the certificate; it names the member (CN
    and DNS SAN) and the loopback host it listens on (IP SAN)."""
    cert_path, key_path = tls_dir / f"{name}.crt", tls_dir / f"{name}.key"
    assert _mode(cert_path) == 0o600 and _mode(key_path) == 0o600
    cert, ca = _cert(cert_path), _cert(tls_dir / "ca.crt")
    cert.verify_directly_issued_by(ca)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == name
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert name in sans.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == [local.HOST]


def _one_line_error(result) -> str:
    """A failed command's whole output: one line on stderr, no traceback."""
    err = result.stderr.decode()
    assert result.returncode == 1, text(result)
    assert result.stdout == b"" and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# --- without processes: what `create` records and writes ----------------------------------


def test_a_tls_cluster_records_https_urls_and_the_flags_of_its_certificates(tmp_path):
    cluster = LocalCluster.create(tmp_path, 3, base_port=40000, tls=True)
    loaded = LocalCluster.load(tmp_path)
    assert loaded.state == cluster.state and loaded.state.tls
    assert loaded.ca_file == str(tmp_path.resolve() / "tls" / "ca.crt")
    tls_dir = tmp_path / "tls"
    assert _mode(tls_dir) == 0o700
    assert sorted(p.name for p in tls_dir.iterdir()) == [
        "ca.crt", "ca.key", "n1.crt", "n1.key", "n2.crt", "n2.key", "n3.crt", "n3.key"]
    assert all(_mode(p) == 0o600 for p in tls_dir.iterdir())
    assert _mode(tmp_path / local.TOKEN_FILE) == 0o600  # TLS clusters get the admin token too
    for m in loaded.members:
        assert m.tls and m.client_url == f"https://127.0.0.1:{m.client_port}"
        assert m.peer_url == f"https://127.0.0.1:{m.peer_port}"
        flags = dict(zip(m.args[::2], m.args[1::2], strict=False))
        assert flags["--initial-cluster"].count("=https://127.0.0.1:") == 3
        assert "=http://" not in flags["--initial-cluster"]
        cert, key = (str(tls_dir.resolve() / f"{m.name}.{ext}") for ext in ("crt", "key"))
        assert (flags["--cert-file"], flags["--key-file"]) == (cert, key)
        assert (flags["--peer-cert-file"], flags["--peer-key-file"]) == (cert, key)
        assert flags["--peer-trusted-ca-file"] == loaded.ca_file
        _check_member_certificate(tls_dir, m.name)
    plain = LocalCluster.create(tmp_path / "plain", 1, base_port=40000)
    assert not plain.state.tls and plain.ca_file is None
    assert plain.members[0].client_url.startswith("http://")
    assert not (tmp_path / "plain" / "tls").exists()


def test_certificates_near_their_end_are_renewed_from_the_same_ca(tmp_path):
    cluster = LocalCluster.create(tmp_path, 2, base_port=40000, tls=True)
    tls_dir = tmp_path / "tls"
    ca = Issued((tls_dir / "ca.crt").read_bytes(), (tls_dir / "ca.key").read_bytes())
    issue(ca, "n1", [local.HOST], days=10).write(tls_dir / "n1.crt", tls_dir / "n1.key")
    (tls_dir / "n2.crt").unlink()
    n1_key = (tls_dir / "n1.key").read_bytes()
    assert cluster.renew_certificates(["n1", "n2"]) == ["n1", "n2"]
    for name in ("n1", "n2"):
        _check_member_certificate(tls_dir, name)
        left = _cert(tls_dir / f"{name}.crt").not_valid_after_utc - datetime.now(UTC)
        assert left > timedelta(days=300)
    assert (tls_dir / "n1.key").read_bytes() != n1_key
    assert cluster.renew_certificates(["n1", "n2"]) == []  # fresh ones are kept
    assert LocalCluster.create(tmp_path / "plain", 1, base_port=40000).renew_certificates(
        ["n1"]) == []


def test_a_state_file_from_before_tls_loads_as_a_plain_cluster(tmp_path):
    LocalCluster.create(tmp_path, 2, base_port=40000)
    path = LocalCluster.state_path(tmp_path)
    doc = json.loads(path.read_text())
    del doc["tls"]
    for m in doc["members"]:
        del m["tls"]
    path.write_text(json.dumps(doc))
    loaded = LocalCluster.load(tmp_path)
    assert not loaded.state.tls and loaded.endpoints[0].startswith("http://")


# --- a running TLS cluster ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    require_node()
    root = tmp_path_factory.mktemp("flotilla-tls") / "cluster"
    try:
        out = ok(flotilla("up", "--tls", "--replicas", "3", "--dir", str(root), *FAST_FLAGS))
        yield root, out
    finally:
        tear_down(root)


def test_up_tls_serves_https_with_the_ca_it_made(tls_up):
    root, out = tls_up
    cluster = LocalCluster.load(root)
    assert cluster.state.tls and cluster.alive() == ["n1", "n2", "n3"]
    endpoints = next(line for line in out.splitlines() if line.startswith("endpoints: "))
    assert endpoints == "endpoints: " + ",".join(f"https://127.0.0.1:{m.client_port}"
                                                 for m in cluster.members)
    assert any(line.startswith("ca: ") and line.split()[1].endswith("tls/ca.crt")
               for line in out.splitlines()), out
    assert _mode(root / "tls") == 0o700 and _mode(root / local.TOKEN_FILE) == 0o600
    for name in cluster.names:
        _check_member_certificate(root / "tls", name)
    # Each member's log says both of its ports speak TLS.
    for m in cluster.members:
        log = Path(m.log_file).read_text()
        assert f"serving peers on https://127.0.0.1:{m.peer_port}, clients on " \
               f"https://127.0.0.1:{m.client_port}" in log, log[-2000:]


def test_kv_and_status_through_the_directory(tls_up):
    root, _ = tls_up
    d = ["--dir", str(root)]
    assert ok(flotilla("kv", "put", "tls/greeting", "hello", *d)).startswith("OK index ")
    assert ok(flotilla("kv", "get", "tls/greeting", *d)) == "hello"
    assert ok(flotilla("kv", "put", "tls/other", "x", *d)).startswith("OK index ")
    assert ok(flotilla("kv", "ls", "tls/", *d)).split() == ["tls/greeting", "tls/other"]
    assert ok(flotilla("kv", "del", "tls/other", *d)).strip() == "1"
    doc = json.loads(ok(flotilla("status", "--json", *d)))
    assert doc["role"] == "leader" and sorted(doc["members"]) == ["n1", "n2", "n3"]
    assert all(m["peer_url"].startswith("https://127.0.0.1:") for m in doc["members"].values())
    assert doc["members"][doc["name"]]["client_url"].startswith("https://127.0.0.1:")
    table = ok(flotilla("status", *d)).splitlines()
    rows = [line.split() for line in table[2:]]
    assert [r[0] for r in rows] == ["n1", "n2", "n3"]
    assert sorted(r[1] for r in rows) == ["follower", "follower", "leader"]
    assert all(r[5].startswith("https://") for r in rows)


def test_endpoints_take_the_ca_from_cacert_or_the_environment(tls_up, tmp_path):
    root, _ = tls_up
    cluster = LocalCluster.load(root)
    ca = cluster.ca_file
    url = cluster.members[1].client_url
    ok(flotilla("kv", "put", "tls/by-url", "v1", "--dir", str(root)))
    assert ok(flotilla("kv", "get", "tls/by-url", "--endpoints", url, "--cacert", ca)) == "v1"
    assert ok(flotilla("kv", "get", "tls/by-url", env={"FLOTILLA_ENDPOINTS": url,
                                                        "FLOTILLA_CACERT": ca})) == "v1"
    doc = json.loads(ok(flotilla("status", "-o", "json", "--endpoints", url, "--cacert", ca,
                                 "--token", cluster.token)))
    assert doc["cluster_id"] == cluster.state.cluster_id  # the full status needs the token

    # Without the cluster's CA (the system's CAs, or another CA): refused at once, one line
    # that says which flag gives it.
    other = tmp_path / "other-ca.crt"
    other.write_bytes(make_ca("another CA").cert_pem)
    for extra in ([], ["--cacert", str(other)]):
        began = time.monotonic()
        err = _one_line_error(flotilla("kv", "get", "tls/by-url", "--endpoints", url, *extra))
        assert time.monotonic() - began < 4  # not retried until --timeout (5 s)
        assert "certificate is not trusted" in err and "--cacert FILE" in err, err

    # A plain http:// URL against a TLS member: told to use https://, at once.
    plain = url.replace("https://", "http://")
    began = time.monotonic()
    err = _one_line_error(flotilla("kv", "get", "tls/by-url", "--endpoints", plain,
                                   "--cacert", ca))
    assert time.monotonic() - began < 4
    assert "speaks TLS" in err and f"use {url}" in err and "--cacert" in err, err

    # Files that cannot be used are bad usage or a one-line failure, never a traceback.
    missing = flotilla("kv", "get", "k", "--endpoints", url, "--cacert", str(tmp_path / "no"))
    assert missing.returncode == 2 and "--cacert: cannot read" in missing.stderr.decode()
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    err = _one_line_error(flotilla("kv", "get", "k", "--endpoints", url, "--cacert",
                                   str(garbage)))
    assert "holds no PEM CA certificate" in err, err
    lone_key = flotilla("kv", "get", "k", "--endpoints", url, "--cacert", ca, "--key", ca)
    assert lone_key.returncode == 2 and "--key" in lone_key.stderr.decode()


def test_the_python_client_fails_at_once_on_a_ca_or_scheme_that_cannot_work(tls_up, tmp_path):
    cluster = LocalCluster.load(tls_up[0])
    url = cluster.members[0].client_url
    with cluster.client(timeout=5) as c:  # the cluster's own CA
        assert c.get("tls/greeting").value == b"hello"
    other = tmp_path / "other-ca.crt"
    other.write_bytes(make_ca("another CA").cert_pem)
    for options, endpoint, code in [({"ca_file": str(other)}, url, "untrusted_certificate"),
                                    ({}, url, "untrusted_certificate"),
                                    ({"ca_file": cluster.ca_file},
                                     url.replace("https://", "http://"), "tls_required")]:
        began = time.monotonic()
        with Client(endpoint, timeout=5, **options) as c, pytest.raises(TLSFailure) as failed:
            c.get("tls/greeting")
        assert failed.value.code == code and time.monotonic() - began < 2, failed.value


def test_scale_issues_a_certificate_for_each_new_member_from_the_same_ca(tls_up):
    root, _ = tls_up
    d = ["--dir", str(root)]
    ca_before = (root / "tls" / "ca.crt").read_bytes()
    out = ok(flotilla("scale", "4", *d, timeout=120))
    assert "done: 4 voters" in out, out
    assert (root / "tls" / "ca.crt").read_bytes() == ca_before
    _check_member_certificate(root / "tls", "n4")
    cluster = LocalCluster.load(root)
    n4 = cluster.member("n4")
    assert n4.tls and n4.client_url.startswith("https://") and "--peer-cert-file" in n4.args
    ok(flotilla("kv", "put", "tls/scaled", "4", *d))
    # n4 serves a linearizable read over TLS, verified with the same CA.
    assert ok(flotilla("kv", "get", "tls/scaled", "--endpoints", n4.client_url,
                       "--cacert", cluster.ca_file)) == "4"
    doc = json.loads(ok(flotilla("status", "--json", *d)))
    assert sorted(doc["config"]["voters"]) == ["n1", "n2", "n3", "n4"]

    out = ok(flotilla("scale", "3", *d, timeout=120))
    assert "done: 3 voters" in out, out
    assert not (root / "tls" / "n4.crt").exists() and not (root / "tls" / "n4.key").exists()
    doc = json.loads(ok(flotilla("status", "--json", *d)))
    assert sorted(doc["config"]["voters"]) == ["n1", "n2", "n3"] and doc["config"]["joint"] is None
    assert ok(flotilla("kv", "get", "tls/scaled", *d)) == "4"


def test_down_and_up_resume_the_tls_cluster_with_its_certificates(tls_up):
    root, _ = tls_up
    d = ["--dir", str(root)]
    before = {p.name: p.read_bytes() for p in (root / "tls").iterdir()}
    out = ok(flotilla("down", *d))
    assert "is down" in out
    assert LocalCluster.load(root).alive() == []
    # Stopped: a command names the `up` that starts it again, in one line.
    err = _one_line_error(flotilla("kv", "get", "tls/greeting", *d))
    assert f"flotilla up --dir {root}" in err, err
    out = ok(flotilla("up", *d, "--tls", *FAST_FLAGS))
    assert out.startswith("resumed 3 members") and "https://" in out, out
    assert {p.name: p.read_bytes() for p in (root / "tls").iterdir()} == before
    assert ok(flotilla("kv", "get", "tls/greeting", *d)) == "hello"


def test_up_tls_on_a_stopped_plain_cluster_says_it_resumes_it_without_tls(tmp_path):
    require_node()
    root = tmp_path / "plain"
    try:
        ok(flotilla("up", "--replicas", "1", "--dir", str(root), *FAST_FLAGS))
        ok(flotilla("down", "--dir", str(root)))
        out = ok(flotilla("up", "--tls", "--dir", str(root), *FAST_FLAGS))
        assert "started without TLS; resuming it as it was" in out, out
        assert "endpoints: http://" in out and not (root / "tls").exists()
    finally:
        tear_down(root)


# --- members that ask clients for a certificate (--client-cert-auth) ----------------------


def test_cert_and_key_for_members_that_ask_for_a_client_certificate(local_cluster, tmp_path):
    cluster = local_cluster(1, tls=True, client_cert_auth=True, **FAST)
    cluster.wait_leader(30)
    url, ca = cluster.nodes["n0"].url, str(cluster.ca.ca_file)
    cert, key = cluster.ca.issue("cli-user")
    where = ["--endpoints", url, "--cacert", ca]
    began = time.monotonic()
    err = _one_line_error(flotilla("kv", "put", "k", "v", *where))
    assert time.monotonic() - began < 4
    assert "wants a client certificate" in err and "--cert FILE --key FILE" in err, err
    # A certificate from another CA is refused the same way.
    other_cert, other_key = TestCA(tmp_path / "other").issue("cli-user")
    err = _one_line_error(flotilla("kv", "put", "k", "v", *where, "--cert", str(other_cert),
                                   "--key", str(other_key)))
    assert "wants a client certificate" in err, err
    assert ok(flotilla("kv", "put", "k", "v", *where, "--cert", str(cert), "--key", str(key))
              ).startswith("OK index ")
    env = {"FLOTILLA_CACERT": ca, "FLOTILLA_CERT": str(cert), "FLOTILLA_KEY": str(key)}
    assert ok(flotilla("kv", "get", "k", "--endpoints", url, env=env)) == "v"
    doc = json.loads(ok(flotilla("status", "--json", "--endpoints", url, env=env)))
    assert doc["role"] == "leader"
