"""A follower's acknowledgement of more than the leader sent it is ignored: a broken or hostile
peer claiming more can neither commit entries no quorum holds nor stall replication."""

from __future__ import annotations

from flotilla.node.consensus import Message, Role

from .network import MT, Network


def test_an_ack_beyond_what_was_sent_counts_only_as_what_was_sent():
    net = Network("abc")
    net.campaign("a")
    net.stabilize()
    a = net["a"]
    assert a.role is Role.LEADER
    committed = a.core.log.committed
    net.isolate("b", "c")
    index = a.core.propose(b"x")
    net.process_all()
    # "b" claims far more than it was ever sent, in the leader's term: ignored.
    net.step(Message(MT.APPEND_RESP, to="a", frm="b", term=a.term, index=index + 1000))
    net.process_all()
    pr = a.core.progress["b"]
    assert pr.match < index <= pr.sent_max <= a.core.log.last_index()
    assert a.core.acks_beyond_sent == 1
    # The entry was sent to "b" but never arrived: the claim must not count it as stored.
    assert a.core.log.committed == committed < index
    # Once the network heals, replication to "b" goes on as usual.
    net.heal()
    for _ in range(3):
        net.tick("a")
        net.stabilize()
    assert net["b"].core.log.last_index() == a.core.log.last_index()
    assert a.core.log.committed == a.core.log.last_index()
