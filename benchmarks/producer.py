"""The request producer, run as its own process so it never shares a GIL with the reader.

``python -m benchmarks.producer --bootstrap B --topic T --records N --rate R
--entity-prefix P --entities E`` writes N well-formed requests ``{"id": "r<i>", "entity":
"<P><j>"}`` (Kafka key = the entity) with entities drawn by a seeded generator, either as
fast as it can (``--rate 0``, the backlog) or open-loop at R records/s (pacing every 20
records, never waiting for results). Each record's Kafka timestamp is set by the client at
produce time; that is the request time every contender's latency is measured from.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator, Sequence

import orjson

from streamfer_dev.harness import produce_requests

__all__ = ["main", "request_ids", "requests"]


def request_ids(n: int) -> list[str]:
    """The ids the producer writes, in order."""
    return [f"r{i}" for i in range(n)]


def requests(
    n: int, entity_prefix: str, n_entities: int, seed: int = 7
) -> Iterator[tuple[str, bytes | None, bytes | None]]:
    """``(tag, key, value)`` triples for ``streamfer_dev.harness.produce_requests``."""
    rng = random.Random(seed)
    for i in range(n):
        entity = f"{entity_prefix}{rng.randrange(n_entities)}"
        rid = f"r{i}"
        yield rid, entity.encode(), orjson.dumps({"id": rid, "entity": entity})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.producer")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0.0, help="records/s; 0 = backlog")
    parser.add_argument("--entity-prefix", required=True)
    parser.add_argument("--entities", type=int, required=True)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    produce_requests(
        args.bootstrap,
        args.topic,
        requests(args.records, args.entity_prefix, args.entities, args.seed),
        rate=args.rate,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
