"""The Raft server of one cluster member (``flotilla.node``)."""
