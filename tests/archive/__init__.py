"""Tests of the archive (flotilla.node.archive): file:// and S3 through real S3 servers."""
