"""The seam between the one loop and the kind of group it is a member of.

``Worker`` (``worker.loop.worker``) runs the same turn for a consumer group and a share
group: check its health, acquire records and hand their batches to the processing
threads, settle the outcome of what the threads finished. What differs is behind
``Group``: how records are acquired (``ConsumerGroup``: consumed from the assigned
partitions into each pipeline's batcher, pausing at the in-flight bound, rebalances
inside ``consume``; ``ShareGroup``: one share poll at a time, cut to the record lock's
budget) and how their outcome is settled (committed offsets through the delivery mode,
or ACCEPT and RELEASE acknowledgements). The processing threads, the stage gate, health,
model faults (a parked pipeline) and lanes are the loop's, the same for both kinds.

A share group cannot pause: it holds one poll, at most the in-flight bound, and settles
it before it polls again, so the bound holds without pausing; a pipeline whose model is
at fault holds only its own batches of that poll (the others' are accepted as they
finish), and the next poll waits for them.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Group", "Turn"]


class Turn(Protocol):
    """What a group asks of the loop while it settles a turn that waits (the share
    group's poll in flight): the loop's health check, and whether it was asked to stop."""

    def check(self) -> None:
        """Beat the liveness clock; raise what stopped a processing stage or the client."""
        ...

    @property
    def stopping(self) -> bool:
        """``Worker.stop`` was called: finish what is held within the shutdown timeout."""
        ...


class Group(Protocol):
    """How one kind of group acquires records and settles their outcome (loop thread)."""

    def join(self) -> None:
        """Subscribe to the request topics."""
        ...

    def raise_fatal(self) -> None:
        """Raise ``SourceError`` for a fatal client error reported since start-up."""
        ...

    def acquire(self) -> None:
        """Take the records the group hands this member now (waiting at most the poll
        timeout, or the earliest batch window) and hand their batches to the threads."""
        ...

    def settle(self, turn: Turn) -> None:
        """Serve delivery reports and settle what the threads finished: commit offsets,
        or acknowledge; hold back while the in-flight bound is reached."""
        ...

    def drain(self) -> None:
        """After ``stop()``: finish and settle what is held, within the shutdown timeout;
        raise ``SinkError`` where some of it stays unsettled."""
        ...

    def failed(self, exc: BaseException) -> None:
        """The loop stops on ``exc``: settle nothing more on the way out."""
        ...

    def give_back(self) -> None:
        """Before the processing threads close: give back what no stage started."""
        ...

    def leave(self) -> None:
        """After the threads and background parts stopped: settle what was finished,
        close the client (leaving the group) and flush the producer."""
        ...

    def idle_for(self, seconds: float) -> bool:
        """Burst mode: a member holding nothing, and nothing came for ``seconds``."""
        ...

    def records_of(self, pipeline: str) -> int:
        """Records of ``pipeline`` this member holds unsettled."""
        ...
