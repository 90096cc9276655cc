"""One archive of 300k entries on a real moto_server, through real Spark: the published
snapshot is byte for byte what the node's own restore builds (the one oracle), at an index past
a base snapshot, with many keys, client sessions and every kind of command."""

from __future__ import annotations

import random

import pytest
from flotilla.node.statemachine.kv import encode_delete, encode_put
from flotilla.pipeline.snapshot_at import snapshot_at
from flotilla.pipeline.source import ArchiveRef

from tests.pipeline.archives import REGION, published_payload, replayed_payload, write_archive

COMMANDS = 300_000


def workload(seed: int, count: int) -> list[bytes]:
    """20k keys (a hot hundred), 200 clients with sessions (some retries), 15% deletes, 10%
    compare-and-sets, a clock that moves on in small steps."""
    rng = random.Random(seed)
    keys = [f"user/{i:05d}" for i in range(20_000)]
    hot = keys[:100]
    seqs = [0] * 200
    out = []
    ts = 1_800_000_000_000
    for n in range(count):
        ts += rng.choice((0, 1, 2, 5))
        key = rng.choice(hot) if rng.random() < 0.3 else rng.choice(keys)
        client = seq = None
        if rng.random() < 0.4:
            c = rng.randrange(200)
            seqs[c] += 0 if rng.random() < 0.02 else 1  # a retry now and then
            client, seq = f"client-{c}", max(1, seqs[c])
        roll = rng.random()
        if roll < 0.15:
            out.append(encode_delete(key, ts=ts, client=client, seq=seq))
        elif roll < 0.25:
            out.append(encode_put(key, b"cas%d" % n, ts=ts, prev_index=rng.randrange(n + 2),
                                  client=client, seq=seq))
        else:
            out.append(encode_put(key, rng.randbytes(rng.randrange(8, 64)), ts=ts,
                                  client=client, seq=seq))
    return out


@pytest.mark.timeout(600)
def test_a_300k_entry_archive_on_s3_gives_the_replays_bytes(s3_store, spark):
    url, endpoint = s3_store.url, s3_store.endpoint
    log = write_archive(url, "big", workload(7, COMMANDS), snapshot_at=[120_000],
                        segment_entries=4_000, endpoint=endpoint)
    assert len(log) >= 300_000
    index = len(log) - 1234
    ref = ArchiveRef(url, "big", endpoint, REGION)
    result = snapshot_at(spark, ref, index)
    meta, payload = published_payload(url, result.cluster_id, endpoint)
    assert (meta.index, meta.term, meta.ts_ms) == (index, log[index - 1].term,
                                                   log[index - 1].ts_ms)
    expected = replayed_payload(url, "big", index, endpoint=endpoint)
    assert len(payload) == len(expected) and payload == expected
