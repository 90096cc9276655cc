"""The hostile-peer suite: the attacks of the security review (issue 14) replayed against
real member processes by a peer that knows the cluster id, each asserting the defended
outcome."""
