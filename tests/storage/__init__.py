"""Tests of the member's durable storage (flotilla.node.storage)."""
