"""Deterministic simulation of Raft clusters around the pure consensus core."""
