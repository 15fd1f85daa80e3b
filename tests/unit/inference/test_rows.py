"""A batch's outputs as per-row result fields."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from worker.inference import finite_rows, row_outputs


@pytest.mark.parametrize("count", [0, 1, 2, 3])
def test_each_row_names_every_output_in_model_order(count: int) -> None:
    n = 4
    outputs: dict[str, Any] = {
        "label": np.array([0, 1, 1, 0], dtype=np.int64),
        "scores": np.arange(8, dtype=np.float32).reshape(n, 2) / 8,
        "names": np.array(["a", "b", "c", "d"], dtype=object),
    }
    chosen = dict(list(outputs.items())[:count])
    rows = list(row_outputs(chosen, n))
    assert len(rows) == n
    for i, row in enumerate(rows):
        assert list(row) == list(chosen)
        for name, values in chosen.items():
            assert row[name] == values.tolist()[i]


def test_a_row_with_nan_in_any_float_output_is_not_finite() -> None:
    outputs = {
        "label": np.array([0, 1, 2]),
        "scores": np.array([[0.1, 0.9], [np.nan, 0.5], [0.2, 0.8]], dtype=np.float32),
    }
    assert finite_rows(outputs, 3).tolist() == [True, False, True]
