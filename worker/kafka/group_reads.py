"""Group reads in a child process, so that a librdkafka abort costs the child only.

``describe_consumer_groups`` is a coordinator-targeted admin request, and librdkafka
aborts the whole process (``rd_kafka_enq_once_del_source_return: Assertion
`eonce->refcnt > 0' failed``, confluentinc/librdkafka issue 4605, fix still open in pull
request 5397) when the connection drops while such a request is sent: seen here, both
workers of a chaos run gone with SIGABRT when the broker went down during a coverage
check. So ``ChildGroupReader`` keeps one long-lived ``python -m worker.kafka.group_reads``
child: it sends the admin settings once (on stdin, so credentials never show in a
process list), then one line per read, and gets one JSON line back. A child that dies
or does not answer in time is killed, the read raises ``OSError``, and the next read
starts a new one.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
from collections.abc import Sequence
from typing import IO, Any

from confluent_kafka.admin import AdminClient

from worker.config import KafkaSettings
from worker.kafka.group_coverage import AdminGroupReader, GroupView

__all__ = ["ChildGroupReader", "child_settings", "main"]

CHILD = [sys.executable, "-m", "worker.kafka.group_reads"]


def child_settings(
    settings: KafkaSettings, topics: Sequence[str], timeout_s: float = 10.0
) -> dict[str, Any]:
    """What the child needs: the admin client's options, the group and its topics."""
    conf: dict[str, Any] = {"bootstrap.servers": settings.bootstrap_servers, "log_level": 2}
    conf.update(settings.client_options())
    return {
        "conf": conf,
        "group": settings.group_id,
        "topics": list(topics),
        "timeout_s": timeout_s,
    }


def _to_json(view: GroupView) -> str:
    return json.dumps(
        {
            "stable": view.stable,
            "members": {m: sorted(parts) for m, parts in view.members.items()},
            "partitions": sorted(view.partitions),
        }
    )


def _from_json(line: str) -> GroupView:
    data = json.loads(line)
    if "error" in data:
        raise OSError(f"group read failed: {data['error']}")
    return GroupView(
        stable=bool(data["stable"]),
        members={m: frozenset((t, p) for t, p in parts) for m, parts in data["members"].items()},
        partitions=frozenset((t, p) for t, p in data["partitions"]),
    )


class ChildGroupReader:
    """A ``GroupReader`` whose admin client lives in a child process (``CHILD``)."""

    def __init__(
        self, settings: dict[str, Any], *, argv: Sequence[str] = CHILD, answer_s: float = 15.0
    ) -> None:
        self._settings = settings
        self._argv = list(argv)
        self._answer_s = answer_s
        self._child: subprocess.Popen[str] | None = None

    def read(self) -> GroupView:
        """One read; raises ``OSError`` when the child dies, fails or is too slow."""
        child = self._child if self._child is not None else self._start()
        out = _pipe(child.stdout)
        try:
            _pipe(child.stdin).write("read\n")
            _pipe(child.stdin).flush()
            ready, _, _ = select.select([out], [], [], self._answer_s)
            line = out.readline() if ready else ""
        except (OSError, ValueError):  # ValueError: ``close`` ran under this read
            line = ""
        if not line:
            self.close()
            raise OSError("the group reader child died or did not answer")
        return _from_json(line)

    def _start(self) -> subprocess.Popen[str]:
        child = subprocess.Popen(
            self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        _pipe(child.stdin).write(json.dumps(self._settings) + "\n")
        self._child = child
        return child

    def close(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        child.kill()
        child.wait()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def _pipe(stream: IO[str] | None) -> IO[str]:
    assert stream is not None, "the child is started with both pipes"
    return stream


def main() -> None:
    """The child: settings on the first line of stdin, then one answer per line."""
    settings = json.loads(sys.stdin.readline())
    admin = AdminClient(settings["conf"])
    reader = AdminGroupReader(admin, settings["group"], settings["topics"], settings["timeout_s"])
    for _line in sys.stdin:
        try:
            answer = _to_json(reader.read())
        except Exception as exc:  # every failure is an answer; the parent decides
            answer = json.dumps({"error": str(exc)})
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
