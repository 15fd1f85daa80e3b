"""One loop for both kinds of group: ``wire_worker`` returns the same ``Worker`` around a
consumer group and a share group, and what the loop checks each turn (a fatal client
error, a failed processing stage) stops either kind the same way."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from streamfer_dev.modelgen import DemoModel
from tests.fakes.share import share_worker
from tests.fakes.worker import TOPIC, build_worker
from worker.errors import SourceError
from worker.loop import ConsumerGroup, ShareGroup, Worker

FATAL = KafkaError(KafkaError.UNRELEASED_INSTANCE_ID, "The instance ID is still used", fatal=True)


def consumer_group(classifier: DemoModel) -> Worker:
    worker, consumer, _sink, _store = build_worker(classifier)
    consumer.assign((TOPIC, 0))
    return worker


def share_group(classifier: DemoModel) -> Worker:
    return share_worker(classifier).worker


KINDS = {"consumer": (consumer_group, ConsumerGroup), "share": (share_group, ShareGroup)}


@pytest.mark.parametrize("kind", list(KINDS))
def test_both_kinds_are_the_one_worker_with_their_group_behind_the_seam(
    classifier: DemoModel, kind: str
) -> None:
    make, group = KINDS[kind]
    worker = make(classifier)
    assert type(worker) is Worker and isinstance(worker.group, group)
    worker.health.loop_turned_at = 0.0
    assert not worker.health.live()
    worker.run_once()
    assert worker.health.live(), "the loop's turn beats the liveness clock"


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_fatal_client_error_stops_either_kind_on_its_next_turn(
    classifier: DemoModel, kind: str
) -> None:
    worker = KINDS[kind][0](classifier)
    worker.run_once()
    worker.group._events.on_error(FATAL)  # type: ignore[attr-defined]
    with pytest.raises(SourceError, match="fatal consumer error"):
        worker.run_once()
