"""The canary split: which records of a batch a pipeline's canary model scores.

A record goes to the canary when the BLAKE2b digest (8 bytes, big-endian) of its Kafka
key, modulo 10,000, is below ``percent`` x 100 rounded to a whole bucket
(``worker.config.canary_buckets``; the config refuses a percent below one bucket): the
same key always goes the same way, on every worker and after every restart, so one
entity's requests are all scored by one model, and raising ``percent`` only adds keys.
A record without a key is split by its request id (its UTF-8 bytes) instead. The split
is computed while a batch is decoded, once per batch, as a boolean mask over the rows
that reach the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b

import numpy as np
import numpy.typing as npt

from worker.config import CANARY_BUCKETS, canary_buckets
from worker.inference import ModelSlot

__all__ = ["BUCKETS", "Canary", "canary_bucket", "canary_mask"]

BUCKETS = CANARY_BUCKETS


def canary_bucket(key: bytes) -> int:
    """The bucket, 0 to 9,999, of a record key (or of a request id's UTF-8 bytes)."""
    return int.from_bytes(blake2b(key, digest_size=8).digest(), "big") % BUCKETS


def canary_mask(
    keys: Sequence[bytes | None], ids: Sequence[str], percent: float
) -> npt.NDArray[np.bool_]:
    """True for each row whose key (or, without one, request id) is in the canary's
    share; ``keys`` and ``ids`` are aligned."""
    below = canary_buckets(percent)
    digest = blake2b
    return np.fromiter(
        (
            int.from_bytes(
                digest(k if k is not None else i.encode(), digest_size=8).digest(), "big"
            )
            % BUCKETS
            < below
            for k, i in zip(keys, ids, strict=True)
        ),
        dtype=np.bool_,
        count=len(ids),
    )


class Canary:
    """A pipeline's canary: its model (a slot, read once per batch like the pipeline's)
    and the share of keys it scores."""

    def __init__(self, slot: ModelSlot, percent: float) -> None:
        if not 100 / BUCKETS <= percent <= 100:  # one bucket at least, as the config says
            raise ValueError(f"percent must be in [{100 / BUCKETS:g}, 100], got {percent:g}")
        self.slot = slot
        self.percent = percent

    def mask(self, keys: Sequence[bytes | None], ids: Sequence[str]) -> npt.NDArray[np.bool_]:
        return canary_mask(keys, ids, self.percent)
