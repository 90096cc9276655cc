"""What only the S3 backend has to get right: failures of the network and the store, the
fallback for stores without conditional writes, and never showing credentials."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ResponseStreamingError
from flotilla.node.archive import (
    ArchiveConflict,
    ArchiveCorrupt,
    ArchiveError,
    ArchiveNotFound,
    ArchiveUnavailable,
    S3Encryption,
    open_archive,
)

from tests.archive.stores import BUCKET, REGION, TEST_SETTINGS, S3Backend, free_port

LEAKY_KEY_ID = "AKIAFLOTILLALEAKCHECK"
LEAKY_SECRET = "flotilla-secret-that-must-never-leak"


@pytest.fixture
def s3(moto):
    return S3Backend(moto)


def closed_port_archive(**settings: Any):
    return open_archive(
        f"s3://{BUCKET}/down",
        endpoint=f"http://127.0.0.1:{free_port()}",  # nothing listens there
        region=REGION,
        settings=replace(TEST_SETTINGS, connect_timeout=0.5, **settings),
    )


def test_an_unreachable_endpoint_is_unavailable_within_a_bounded_time(aws_env):
    archive = closed_port_archive(max_attempts=2)
    for operation in (
        lambda: archive.put_bytes("k", b"v"),
        lambda: archive.get_bytes("k"),
        lambda: archive.head("k"),
        lambda: list(archive.list_keys("")),
        lambda: archive.delete("k"),
    ):
        started = time.monotonic()
        with pytest.raises(ArchiveUnavailable) as caught:
            operation()
        assert time.monotonic() - started < 10
        message = str(caught.value)
        assert "unreachable" in message and "retry" in message and "127.0.0.1" in message


def test_a_missing_bucket_says_so_and_what_to_do(moto):
    archive = open_archive(
        "s3://no-such-bucket-here/x", endpoint=moto.endpoint, region=REGION,
        settings=TEST_SETTINGS,
    )
    with pytest.raises(ArchiveError, match=r"does not exist.*create it"):
        archive.put_bytes("k", b"v")
    with pytest.raises(ArchiveError, match="does not exist"):
        list(archive.list_keys(""))


def test_credentials_never_appear_in_errors_reprs_or_logs(moto, monkeypatch, caplog):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LEAKY_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", LEAKY_SECRET)
    caplog.set_level(logging.DEBUG, logger="flotilla")
    backend = S3Backend(moto)
    archive = backend.open()
    archive.put_bytes("k", b"v")
    backend.overwrite("k", b"changed", digest="0" * 64)
    errors: list[BaseException] = []
    for operation in (
        lambda: archive.get_bytes("missing"),  # not found
        lambda: archive.put_bytes("k", b"other"),  # conflict
        lambda: archive.get_bytes("k"),  # corrupt
        lambda: open_archive("s3://no-such-bucket-here", endpoint=moto.endpoint,
                             region=REGION).put_bytes("k", b"v"),
        lambda: closed_port_archive().head("k"),  # unavailable
    ):
        with pytest.raises(ArchiveError) as caught:
            operation()
        errors.append(caught.value)
    kinds = [type(error) for error in errors]
    assert kinds == [ArchiveNotFound, ArchiveConflict, ArchiveCorrupt, ArchiveError,
                     ArchiveUnavailable]
    texts = [repr(archive), str(archive), caplog.text]
    for error in errors:
        chain: BaseException | None = error
        while chain is not None:
            texts += [str(chain), repr(chain)]
            chain = chain.__cause__ or chain.__context__
    for text in texts:
        assert LEAKY_KEY_ID not in text and LEAKY_SECRET not in text


@pytest.mark.parametrize("url", ["s3://AKIA:secret@bucket/p", "s3://user@bucket"])
def test_urls_with_credentials_are_refused_without_echoing_them(url):
    with pytest.raises(ValueError) as caught:
        open_archive(url)
    assert "secret" not in str(caught.value) and "AKIA" not in str(caught.value)


def test_an_endpoint_with_credentials_is_refused_without_echoing_them():
    with pytest.raises(ValueError) as caught:
        open_archive("s3://bucket/p", endpoint="http://AKIA:secret@127.0.0.1:9000")
    assert "secret" not in str(caught.value) and "AKIA" not in str(caught.value)


def _refuse_conditional_writes(archive) -> list[bool]:
    """Make the store answer 501 to any request carrying If-None-Match, as stores without
    conditional writes do; return a log of whether each write carried the header."""
    seen: list[bool] = []

    def before_send(request, **_: Any):
        if request.method != "PUT" and "uploadId" not in request.url:
            return None
        conditional = "If-None-Match" in request.headers
        seen.append(conditional)
        if not conditional:
            return None
        body = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>NotImplemented</Code>"
                b"<Message>A header you provided implies functionality that is not "
                b"implemented</Message><Header>If-None-Match</Header></Error>")
        return AWSResponse(request.url, 501, {}, _Raw(body))

    archive.client.meta.events.register("before-send.s3", before_send)
    return seen


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any):
        yield self.body


def test_a_store_that_rejects_conditional_writes_gets_head_then_put(s3, caplog):
    archive = s3.open()
    seen = _refuse_conditional_writes(archive)
    archive.put_bytes("first", b"1")
    archive.put_bytes("second", b"2")
    assert seen == [True, False, False]  # refused once, then never sent again
    assert "rejects conditional writes" in caplog.text
    assert archive.get_bytes("first") == b"1"
    with pytest.raises(ArchiveConflict):
        archive.put_bytes("first", b"changed")  # the HEAD still guards against overwrites


class _BrokenBody:
    """A response body whose connection drops on the first read."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def read(self, *_: Any) -> bytes:
        raise ResponseStreamingError(error="connection reset mid-body")

    def iter_chunks(self, *_: Any):
        raise ResponseStreamingError(error="connection reset mid-body")

    def close(self) -> None:
        self.inner.close()


def _break_bodies(archive, times: int) -> dict[str, int]:
    state = {"left": times, "gets": 0}

    def after_get(parsed: dict[str, Any], **_: Any) -> None:
        state["gets"] += 1
        if state["left"] > 0:
            state["left"] -= 1
            parsed["Body"] = _BrokenBody(parsed["Body"])

    archive.client.meta.events.register("after-call.s3.GetObject", after_get)
    return state


def test_a_body_that_breaks_off_is_fetched_again(s3, tmp_path, caplog):
    archive = s3.open()
    archive.put_bytes("flaky", b"payload")
    state = _break_bodies(archive, times=1)
    assert archive.get_bytes("flaky") == b"payload"
    assert state["gets"] == 2
    assert "broke off" in caplog.text
    _break_bodies(archive, times=1)
    archive.download("flaky", tmp_path / "flaky")
    assert (tmp_path / "flaky").read_bytes() == b"payload"


def test_a_body_that_keeps_breaking_off_is_unavailable_after_bounded_attempts(s3):
    archive = s3.open()
    archive.put_bytes("flaky", b"payload")
    state = _break_bodies(archive, times=100)
    with pytest.raises(ArchiveUnavailable, match="broke off 2 times"):
        archive.get_bytes("flaky")
    assert state["gets"] == TEST_SETTINGS.stream_attempts


def test_repr_names_the_archive_and_endpoint(s3):
    archive = s3.open()
    assert repr(archive) == (
        f"S3Archive('{s3.url}', endpoint='{s3.server.endpoint}', region='{REGION}')"
    )
    assert archive.url_for("a/b") == f"{s3.url}/a/b"


@pytest.mark.parametrize("encryption", [S3Encryption("AES256"),
                                        S3Encryption("aws:kms", "alias/flotilla-archive")],
                         ids=["AES256", "aws:kms"])
def test_every_write_asks_for_server_side_encryption(s3, tmp_path, encryption):
    """Small objects (PutObject) and big ones (a multipart upload) alike: the store reports
    each encrypted as asked, and reads need nothing more."""
    archive = open_archive(s3.url, endpoint=s3.server.endpoint, region=REGION,
                           settings=TEST_SETTINGS, encryption=encryption)
    big = tmp_path / "big"
    big.write_bytes(b"x" * (TEST_SETTINGS.multipart_threshold + 1))
    try:
        archive.put_bytes("c1/manifests/small.json", b"{}")
        archive.put_file("c1/snapshots/big.snap", big)
        for key in ("c1/manifests/small.json", "c1/snapshots/big.snap"):
            head = s3.server.raw_client().head_object(Bucket=BUCKET, Key=f"{s3.prefix}/{key}")
            assert head["ServerSideEncryption"] == encryption.mode, key
            if encryption.kms_key_id is not None:
                assert head["SSEKMSKeyId"].endswith(encryption.kms_key_id), key
        assert archive.get_bytes("c1/manifests/small.json") == b"{}"
    finally:
        archive.close()
    plain = s3.open()  # without the option, the store reports none (so the check above tells)
    try:
        plain.put_bytes("c1/manifests/plain.json", b"{}")
    finally:
        plain.close()
    head = s3.server.raw_client().head_object(Bucket=BUCKET,
                                              Key=f"{s3.prefix}/c1/manifests/plain.json")
    assert "ServerSideEncryption" not in head


def test_encryption_options_are_checked_in_one_line():
    assert S3Encryption.parse(None, None) is None
    assert S3Encryption.parse("aws:kms", "k1").put_args() == {
        "ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "k1"}
    for mode, key, says in (("AES128", None, "must be AES256 or aws:kms"),
                            ("AES256", "k1", "goes with --s3-sse aws:kms"),
                            (None, "k1", "goes with --s3-sse aws:kms")):
        with pytest.raises(ValueError, match=says):
            S3Encryption.parse(mode, key)
