"""The readiness rule for a fresh Redis Cluster: every node ok, one slot map, all slots."""

from __future__ import annotations

import pytest

from streamfer_dev.redis_cluster_ready import SLOTS, slot_map, unready_reason, wait_until_ready
from worker.errors import StackError

A, B = "127.0.0.1:7001", "127.0.0.1:7002"
HALVES = frozenset({(0, 8191, A), (8192, SLOTS - 1, B)})


def test_a_cluster_slots_reply_becomes_rows_of_ranges_and_primaries() -> None:
    reply = [
        [0, 8191, [b"127.0.0.1", 7001, b"id-a", {}]],
        [8192, 16383, [b"127.0.0.1", 7002, b"id-b", {}], [b"127.0.0.1", 7003, b"id-c", {}]],
    ]
    assert slot_map(reply) == HALVES


def test_every_node_ok_on_one_full_map_is_ready() -> None:
    assert unready_reason({A: "ok", B: "ok"}, {A: HALVES, B: HALVES}) is None


def test_a_node_still_failing_is_not_ready_and_is_named() -> None:
    reason = unready_reason({A: "ok", B: "fail"}, {A: HALVES, B: HALVES})
    assert reason is not None and B in reason and A not in reason


def test_nodes_that_disagree_on_the_slot_map_are_not_ready() -> None:
    partial = frozenset({(0, 8191, A)})
    reason = unready_reason({A: "ok", B: "ok"}, {A: HALVES, B: partial})
    assert reason == "the nodes disagree on the slot map"


@pytest.mark.parametrize(
    "slots",
    [
        frozenset({(0, 8191, A), (8193, SLOTS - 1, B)}),  # slot 8192 unassigned
        frozenset({(0, 8191, A), (8192, SLOTS - 2, B)}),  # the last slot unassigned
        frozenset({(1, SLOTS - 1, A)}),  # the first slot unassigned
    ],
)
def test_a_map_one_slot_short_is_not_ready(slots: frozenset[tuple[int, int, str]]) -> None:
    reason = unready_reason({A: "ok"}, {A: slots})
    assert reason == f"the slot map does not cover all {SLOTS} slots"


def test_a_node_nobody_listens_on_times_out_with_the_reason() -> None:
    from streamfer_dev.stack import free_port

    with pytest.raises(StackError, match="not ready after 1 s: a node did not answer"):
        wait_until_ready([f"127.0.0.1:{free_port()}"], timeout=1.0)
