"""Group reads in a child process: answers come back, a child that dies costs one read."""

from __future__ import annotations

import sys

import pytest

from worker.config import KafkaSettings
from worker.kafka.group_reads import ChildGroupReader, child_settings

# Answers every read with one view; with "die" in the settings, aborts on the second.
FAKE = """
import json, os, sys
settings = json.loads(sys.stdin.readline())
for n, _line in enumerate(sys.stdin):
    if settings.get("die") and n == 1:
        os.abort()
    if settings.get("silent"):
        continue
    print(json.dumps({"stable": True, "members": {"a": [["t", 1]], "b": []},
                      "partitions": [["t", 0], ["t", 1]]}), flush=True)
"""


def reader(**settings: object) -> ChildGroupReader:
    return ChildGroupReader(dict(settings), argv=[sys.executable, "-c", FAKE], answer_s=2.0)


def test_a_read_comes_back_as_a_view() -> None:
    r = reader()
    try:
        for _ in range(2):  # one child serves every read
            view = r.read()
            assert view.stable
            assert view.members == {"a": frozenset({("t", 1)}), "b": frozenset()}
            assert view.partitions == {("t", 0), ("t", 1)}
    finally:
        r.close()


def test_a_child_that_aborts_costs_one_read_and_the_next_starts_a_new_one() -> None:
    r = reader(die=True)
    try:
        r.read()
        with pytest.raises(OSError):
            r.read()
        assert r.read().stable  # a fresh child
    finally:
        r.close()


def test_a_child_that_does_not_answer_is_killed() -> None:
    r = reader(silent=True)
    try:
        with pytest.raises(OSError):
            r.read()
        assert r._child is None
    finally:
        r.close()


def test_the_child_gets_the_client_options_and_never_a_logger() -> None:
    settings = KafkaSettings(
        bootstrap_servers="b:9092", group_id="g", options={"security.protocol": "SSL"}
    )
    got = child_settings(settings, ["t"])
    assert got["conf"]["bootstrap.servers"] == "b:9092"
    assert got["conf"]["security.protocol"] == "SSL"
    assert got["group"] == "g" and got["topics"] == ["t"]


def test_a_read_whose_pipes_are_closed_under_it_fails_as_a_failed_read() -> None:
    """Shutdown closes the reader while the coverage thread reads: the read raises
    ``OSError`` like any failed read, never ``ValueError`` from a closed file."""
    r = reader()
    try:
        r.read()
        child = r._child
        assert child is not None and child.stdout is not None
        child.stdout.close()  # what ``close`` on the stopping thread does mid-read
        with pytest.raises(OSError, match="died or did not answer"):
            r.read()
        assert r._child is None
    finally:
        r.close()
