"""Cache keys: a 16-byte digest of each row's model inputs, under the model's namespace.

The output cache (``worker.cache.output_cache``) may hand a row the outputs computed for an
earlier row only when the model would see the very same bytes. So a key covers what
reaches the model after inline values and stored features are merged (``worker.pipeline.feeds``
assembles them), not the request: per input, in model order, its name, dtype and row
width once per batch, then the row's bytes (a string cell as its UTF-8 length and
bytes). ``model_namespace`` folds in what else decides a published row: the model file's
SHA-256, the result field names and class names, and the execution provider (a GPU's
sums differ from the CPU's in the last bits, and FP16 in more).

Work is per batch: every numeric input (and the string cells' lengths) goes into one
row-major byte matrix, led by the batch's namespace, with one numpy call each, and a
row's key is one BLAKE2b call on its slice, plus its string cells when it has any.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

__all__ = ["KEY_BYTES", "model_namespace", "row_keys"]

KEY_BYTES = 16
"""Digest size: 128 bits, so two different rows share a key with odds of about n² / 2¹²⁹."""

_blake2b = hashlib.blake2b


def model_namespace(
    model_hash: str,
    *,
    fields: Sequence[str] | None,
    class_names: Sequence[str] | None,
    provider: str | None,
    fp16: bool = False,
) -> bytes:
    """The 32-byte key under which one model's rows are digested: two configs share
    cache entries only when every part of it is equal."""
    identity = {
        "format": 1,
        "model_sha256": model_hash,
        "fields": list(fields) if fields is not None else None,
        "class_names": list(class_names) if class_names is not None else None,
        "provider": provider,
        "fp16": fp16,
    }
    return _blake2b(orjson.dumps(identity), digest_size=32).digest()


def row_keys(namespace: bytes, feeds: Mapping[str, npt.NDArray[Any]]) -> list[bytes]:
    """One key per row of ``feeds`` (one array per model input, model order, all with
    the same number of rows). String inputs are object arrays of str."""
    arrays = list(feeds.items())
    n = len(arrays[0][1]) if arrays else 0
    if not n:
        return []
    layout: list[object] = []
    fixed: list[npt.NDArray[np.uint8]] = []
    texts: list[list[bytes]] = []
    for name, array in arrays:
        if len(array) != n:
            raise ValueError(f"input {name!r} has {len(array)} rows, not {n}")
        cells = array.reshape(n, -1) if array.ndim != 2 else array
        layout.append([name, array.dtype.str, cells.shape[1]])
        if array.dtype.kind == "O":
            encoded = [_utf8(c) for c in cells.ravel().tolist()]
            lengths = np.fromiter(map(len, encoded), dtype="<u4", count=len(encoded))
            fixed.append(lengths.reshape(n, -1).view(np.uint8))
            texts.append(encoded)
        else:
            fixed.append(np.ascontiguousarray(cells).view(np.uint8))
    # the batch's own key (namespace and layout) leads every row: an unkeyed BLAKE2b
    # over the slice costs less than a keyed one per row
    head = _blake2b(orjson.dumps(layout), digest_size=32, key=namespace).digest()
    prefix = np.broadcast_to(np.frombuffer(head, dtype=np.uint8), (n, len(head)))
    matrix = np.concatenate([prefix, *fixed], axis=1)
    width = matrix.shape[1]
    rows = memoryview(matrix.tobytes())
    if not texts:
        return [
            _blake2b(rows[at : at + width], digest_size=KEY_BYTES).digest()
            for at in range(0, n * width, width)
        ]
    return _with_texts(rows, width, n, texts)


def _with_texts(rows: memoryview, width: int, n: int, texts: list[list[bytes]]) -> list[bytes]:
    per_row = [len(cells) // n if n else 0 for cells in texts]
    out: list[bytes] = []
    append = out.append
    join = b"".join
    for r in range(n):
        h = _blake2b(rows[r * width : (r + 1) * width], digest_size=KEY_BYTES)
        for cells, k in zip(texts, per_row, strict=True):
            h.update(join(cells[r * k : (r + 1) * k]))
        append(h.digest())
    return out


def _utf8(cell: object) -> bytes:
    """A string cell's bytes; anything else (which the model would refuse) by its JSON,
    so that it still gets a key of its own."""
    if isinstance(cell, str):
        return cell.encode("utf-8", "surrogatepass")
    return b"\x00" + orjson.dumps(cell, default=repr)
