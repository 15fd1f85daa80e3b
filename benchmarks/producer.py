"""The request producer, run as its own process so it never shares a GIL with the reader.

``python -m benchmarks.producer --bootstrap B --topic T --records N --rate R
--entity-prefix P --entities E`` writes N well-formed requests ``{"id": "r<i>", "entity":
"<P><j>"}`` (Kafka key = the entity) with entities drawn by a seeded generator, either as
fast as it can (``--rate 0``, the backlog) or open-loop at R records/s (pacing every 20
records, never waiting for results, from ``PRODUCER_ID_WAIT_S`` after it connected).
Each record's Kafka timestamp is set by the client at produce time; that is the request
time every contender's latency is measured from.

``--repeat-share S --distinct D`` makes a stream for the output cache: every request
also carries one feature inline (``--feature``, over its stored value), so that the
inputs are set by the producer, not by the few hundred stored entities. A share S of the
requests repeat one of D distinct inputs (entity ``j % E`` with the feature at
``5 + j/1024``, j drawn uniformly), and the rest are inputs never sent before (the
feature at ``30 + i/1024`` for request i). Every value is exactly a float32.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator, Sequence

import orjson

from streamfer_dev.harness import produce_requests

__all__ = ["PRODUCER_ID_WAIT_S", "main", "request_ids", "requests"]

PRODUCER_ID_WAIT_S = 0.6
"""A paced run's first request waits this long after the producer has connected. An
idempotent producer sends nothing before it holds a producer id, and when its first
attempt finds no broker connected yet it asks again only 500 ms later: measured here, a
new producer process's first records waited 500-519 ms in 4 of 15 tries (the others
1-10 ms), and a paced run's first half second of requests waited so in about half the
steps of a latency curve, whichever the contender. The wait also covers the first fetch
of the contender, assigned before this process starts (``benchmarks.measure.read_results``)."""


def request_ids(n: int) -> list[str]:
    """The ids the producer writes, in order."""
    return [f"r{i}" for i in range(n)]


def requests(
    n: int,
    entity_prefix: str,
    n_entities: int,
    seed: int = 7,
    *,
    repeat_share: float | None = None,
    distinct: int = 1000,
    feature: str = "f0",
) -> Iterator[tuple[str, bytes | None, bytes | None]]:
    """``(tag, key, value)`` triples for ``streamfer_dev.harness.produce_requests``."""
    rng = random.Random(seed)
    for i in range(n):
        rid = f"r{i}"
        if repeat_share is None:
            entity = f"{entity_prefix}{rng.randrange(n_entities)}"
            yield rid, entity.encode(), orjson.dumps({"id": rid, "entity": entity})
            continue
        if rng.random() < repeat_share:
            j = rng.randrange(distinct)
            entity, value = f"{entity_prefix}{j % n_entities}", 5.0 + j / 1024
        else:
            entity, value = f"{entity_prefix}{rng.randrange(n_entities)}", 30.0 + i / 1024
        doc = {"id": rid, "entity": entity, "features": {feature: value}}
        yield rid, entity.encode(), orjson.dumps(doc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.producer")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0.0, help="records/s; 0 = backlog")
    parser.add_argument("--entity-prefix", required=True)
    parser.add_argument("--entities", type=int, required=True)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--repeat-share", type=float, default=None, help="share of requests that repeat"
    )
    parser.add_argument("--distinct", type=int, default=1000, help="inputs the repeats use")
    parser.add_argument("--feature", default="f0", help="the feature sent inline")
    parser.add_argument(
        "--linger-ms",
        type=float,
        default=None,
        help="the request producer's linger.ms (default: the harness's 5); it counts in "
        "every request's latency, which starts at produce time",
    )
    args = parser.parse_args(argv)
    produce_requests(
        args.bootstrap,
        args.topic,
        requests(
            args.records,
            args.entity_prefix,
            args.entities,
            args.seed,
            repeat_share=args.repeat_share,
            distinct=args.distinct,
            feature=args.feature,
        ),
        rate=args.rate,
        producer_options=None if args.linger_ms is None else {"linger.ms": args.linger_ms},
        settle_s=PRODUCER_ID_WAIT_S if args.rate > 0 else 0.0,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
