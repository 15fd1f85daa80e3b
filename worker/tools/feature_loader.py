"""Loading entity features into Redis from CSV or Parquet, in either layout.

``streamfer features load`` reads a file with one row per entity (an entity column plus
one column per feature of the pipeline's spec), writes each row as the pipeline's
layout expects (a hash of text values, or one packed float32 vector), and pipelines the
writes in chunks so a million rows take seconds, not minutes. Parquet needs pyarrow
(the ``parquet`` extra). A missing column, a non-numeric or non-finite
value fails with the file, row and column named, before anything of that chunk is
written. A progress line goes to stderr (``--no-progress`` drops it).
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

import numpy as np
import numpy.typing as npt
import redis

from worker.config import FeatureSpec
from worker.core import Clock, install_command, monotonic_clock
from worker.errors import ConfigError, FeatureStoreError
from worker.features import RedisClient, pack_vector
from worker.tools.progress import ProgressLine

__all__ = ["LoadReport", "load_features", "read_rows"]

Layout = Literal["hash", "packed"]
Chunk = tuple[list[str], npt.NDArray[np.float64]]


@dataclass(frozen=True, slots=True)
class LoadReport:
    rows: int
    seconds: float
    layout: str

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


def read_rows(
    path: Path, entity_column: str, fields: Sequence[str], chunk: int = 5000
) -> tuple[int | None, Iterator[Chunk]]:
    """(row count when the format knows it, chunks of entity ids and feature values)."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return _read_parquet(path, entity_column, fields, chunk)
    if suffix in (".csv", ".tsv", ".txt"):
        return None, _read_csv(
            path, entity_column, fields, chunk, "\t" if suffix == ".tsv" else ","
        )
    raise ConfigError(f"{path}: unknown feature file type {suffix!r} (use .csv, .tsv or .parquet)")


def _read_csv(
    path: Path, entity_column: str, fields: Sequence[str], chunk: int, delimiter: str
) -> Iterator[Chunk]:
    with path.open(newline="") as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            raise ConfigError(f"{path}: the file is empty")
        columns = _columns(path, header, entity_column, fields)
        ids: list[str] = []
        rows: list[list[float]] = []
        for line_no, record in enumerate(reader, start=2):
            if not record:
                continue
            ids.append(record[columns[0]])
            rows.append(
                [_number(path, line_no, fields[j], record[c]) for j, c in enumerate(columns[1:])]
            )
            if len(ids) == chunk:
                yield ids, np.asarray(rows, dtype=np.float64)
                ids, rows = [], []
        if ids:
            yield ids, np.asarray(rows, dtype=np.float64)


def _read_parquet(
    path: Path, entity_column: str, fields: Sequence[str], chunk: int
) -> tuple[int, Iterator[Chunk]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError(f"Parquet needs pyarrow: {install_command('parquet')}") from exc
    parquet = pq.ParquetFile(path)
    _columns(path, parquet.schema_arrow.names, entity_column, fields)

    def chunks() -> Iterator[Chunk]:
        first_row = 1
        for batch in parquet.iter_batches(batch_size=chunk, columns=[entity_column, *fields]):
            ids = [str(v) for v in batch.column(0).to_pylist()]
            values = np.column_stack(
                [
                    np.asarray(batch.column(j + 1).to_numpy(zero_copy_only=False), dtype=np.float64)
                    for j in range(len(fields))
                ]
            )
            bad = ~np.isfinite(values)
            if bad.any():
                r, c = (int(x) for x in np.argwhere(bad)[0])
                raise ConfigError(
                    f"{path}: row {first_row + r}, column {fields[c]!r}: not a finite number"
                )
            first_row += len(ids)
            yield ids, values

    return parquet.metadata.num_rows, chunks()


def _columns(
    path: Path, header: Sequence[str], entity_column: str, fields: Sequence[str]
) -> list[int]:
    missing = [c for c in (entity_column, *fields) if c not in header]
    if missing:
        raise ConfigError(f"{path}: missing columns {missing}; it has {list(header)[:20]}")
    return [list(header).index(c) for c in (entity_column, *fields)]


def _number(path: Path, line: int, column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"{path}: line {line}, column {column!r}: {text[:32]!r} is not a number"
        ) from None
    if not math.isfinite(value):
        raise ConfigError(f"{path}: line {line}, column {column!r}: {text!r} is not finite")
    return value


def load_features(
    client: RedisClient,
    spec: FeatureSpec,
    path: Path,
    *,
    entity_column: str = "entity",
    layout: Layout | None = None,
    chunk: int = 5000,
    progress: bool = True,
) -> LoadReport:
    """Write every row of ``path`` to Redis; returns how many and how fast."""
    layout = layout or spec.layout
    total, chunks = read_rows(path, entity_column, spec.fields, chunk)
    prefix, suffix = spec.key_template.split("{entity}", 1)
    fields = list(spec.fields)
    bar = _RowProgress(total) if progress else None
    started = time.perf_counter()
    written = 0
    try:
        for ids, values in chunks:
            pipe = client.pipeline(transaction=False)
            if layout == "packed":
                pipe.mset(
                    {
                        f"{prefix}{e}{suffix}": pack_vector(row)
                        for e, row in zip(ids, values, strict=True)
                    }
                )
            else:
                for e, row in zip(ids, values.tolist(), strict=True):
                    pipe.hset(
                        f"{prefix}{e}{suffix}",
                        mapping=dict(zip(fields, map(repr, row), strict=True)),
                    )
            pipe.execute()
            written += len(ids)
            if bar is not None:
                bar.update(written)
    except redis.RedisError as exc:
        raise FeatureStoreError(f"writing features failed after {written} rows: {exc}") from exc
    finally:
        if bar is not None:
            bar.finish(written)
    return LoadReport(written, time.perf_counter() - started, layout)


class _RowProgress(ProgressLine):
    """Rows written so far, drawn like ``streamfer replay``'s line. A CSV file's row count
    is unknown, so then there is no share."""

    def __init__(
        self,
        total: int | None,
        *,
        stream: TextIO | None = None,
        every_s: float | None = None,
        clock: Clock = monotonic_clock,
    ) -> None:
        def describe(done: int, elapsed: float) -> str:
            rate = done / elapsed if elapsed > 0 else 0.0
            rows = f"{done:,}"
            if total:
                rows += f"/{total:,} rows {min(1.0, done / total) * 100:5.1f}%"
            else:
                rows += " rows"
            return f"loading features {rows} {rate:,.0f} rows/s"

        super().__init__(describe, stream=stream, every_s=every_s, clock=clock)
