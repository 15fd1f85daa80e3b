"""How long a librdkafka consumer takes, after ``resume()``, to deliver records again.

``python -m benchmarks.pause_resume [--records N] [--cycles C] [--option KEY=VALUE ...]``
writes a backlog to a 4-partition topic on the local stack (or
``KAFKA_BOOTSTRAP_SERVERS``), then repeats: consume 1024 records, pause every assigned
partition, keep polling for ~60 ms, resume, and time until ``consume`` returns a record
again. A worker that pauses its partitions for backpressure pays this gap on every
pause; the records are already on the broker, so any gap is the client's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence

from confluent_kafka import Consumer

from benchmarks.contenders import ROOT
from streamfer_dev.harness import percentile
from streamfer_dev.stack import local_kafka
from worker.kafka import ensure_topics

__all__ = ["main", "resume_gaps"]


def resume_gaps(bootstrap: str, topic: str, cycles: int, options: dict[str, str]) -> list[float]:
    """Milliseconds from ``resume()`` to the next record, once per cycle."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"pause-resume-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "partition.assignment.strategy": "cooperative-sticky",
            **options,
        }
    )
    gaps: list[float] = []
    try:
        consumer.subscribe([topic])
        while not consumer.consume(256, 1.0):
            pass
        for _ in range(cycles):
            taken = 0
            while taken < 1024:
                taken += len(consumer.consume(256, 1.0))
            parts = consumer.assignment()
            consumer.pause(parts)
            for _ in range(3):
                consumer.consume(256, 0.02)
            consumer.resume(parts)
            started = time.monotonic()
            while not consumer.consume(256, 0.01):
                if time.monotonic() - started > 30:
                    break
            gaps.append((time.monotonic() - started) * 1000.0)
    finally:
        consumer.close()
    return gaps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pause_resume")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    options = dict(o.split("=", 1) for o in args.option)
    need = (args.cycles + 1) * 1024 + 256
    with local_kafka() as bootstrap:
        topic = f"pause-resume-{uuid.uuid4().hex[:8]}"
        ensure_topics(bootstrap, [(topic, 4)])
        subprocess.run(
            [
                *(sys.executable, "-m", "benchmarks.producer", "--bootstrap", bootstrap),
                *("--topic", topic, "--records", str(max(args.records, need))),
                *("--entity-prefix", "e", "--entities", "100"),
            ],
            cwd=ROOT,
            check=True,
        )
        gaps = resume_gaps(bootstrap, topic, args.cycles, options)
    print(
        f"resume -> next record, ms: p50 {percentile(gaps, 50):.0f}, max {max(gaps):.0f}"
        f" ({', '.join(f'{g:.0f}' for g in gaps)}); options {options or 'default'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
