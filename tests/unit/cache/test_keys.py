"""Cache keys: equal exactly when the model would see the same bytes under the same model."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from worker.cache.keys import KEY_BYTES, model_namespace, row_keys

SHA = "ab" * 32


def ns(**kw: Any) -> bytes:
    args: dict[str, Any] = {
        "fields": ["label", "scores"],
        "class_names": None,
        "provider": "CPUExecutionProvider",
    }
    args.update(kw)
    return model_namespace(kw.pop("sha", SHA), **{k: v for k, v in args.items() if k != "sha"})


def floats(rows: list[list[float]]) -> dict[str, npt.NDArray[Any]]:
    return {"input": np.asarray(rows, dtype=np.float32)}


def test_one_key_per_row_and_equal_rows_share_it_wherever_they_sit() -> None:
    a = [0.25, -1.5, 3.0]
    b = [0.25, -1.5, 3.5]
    keys = row_keys(ns(), floats([a, b, a]))
    assert len(keys) == 3 and all(len(k) == KEY_BYTES for k in keys)
    assert keys[0] == keys[2] != keys[1]
    # the same row in another batch, at another position, of another size
    assert row_keys(ns(), floats([b, b, b, b, a]))[4] == keys[0]


def test_the_last_bit_of_one_feature_changes_the_key() -> None:
    row = np.asarray([[0.1, 0.2, 0.3]], dtype=np.float32)
    nudged = row.copy()
    nudged[0, 2] = np.nextafter(row[0, 2], np.float32(1.0))
    assert nudged[0, 2] != row[0, 2] and abs(float(nudged[0, 2] - row[0, 2])) < 1e-7
    assert row_keys(ns(), {"input": row}) != row_keys(ns(), {"input": nudged})


def test_negative_zero_is_not_zero() -> None:
    # the model may tell them apart (1/x, copysign), so the cache does too
    assert row_keys(ns(), floats([[0.0]])) != row_keys(ns(), floats([[-0.0]]))


def test_the_model_hash_result_fields_and_provider_each_change_the_key() -> None:
    feeds = floats([[1.0, 2.0]])
    base = row_keys(ns(), feeds)
    for other in (
        ns(sha="cd" * 32),
        ns(fields=["label", "probabilities"]),
        ns(class_names=["legit", "fraud"]),
        ns(provider="CUDAExecutionProvider"),
        ns(provider="TensorrtExecutionProvider", fp16=True),
    ):
        assert row_keys(other, feeds) != base


def test_dtype_name_and_width_of_an_input_are_part_of_the_key() -> None:
    values = np.asarray([[1, 2]], dtype=np.int32)
    same_bytes = values.view(np.float32)  # identical bytes, another dtype
    assert values.tobytes() == same_bytes.tobytes()
    base = row_keys(ns(), {"input": values})
    assert row_keys(ns(), {"input": same_bytes}) != base
    assert row_keys(ns(), {"other": values}) != base
    # one row of 2 int32 is not two inputs of 1
    split = {"input": values[:, :1].copy(), "input_b": values[:, 1:].copy()}
    assert row_keys(ns(), split) != base


def test_string_cells_are_length_prefixed() -> None:
    def texts(rows: list[list[str]]) -> dict[str, npt.NDArray[Any]]:
        return {"categorical": np.asarray(rows, dtype=object)}

    keys = row_keys(ns(), texts([["ab", "c"], ["a", "bc"], ["ab", "c"], ["", "abc"]]))
    assert keys[0] == keys[2]
    assert len({keys[0], keys[1], keys[3]}) == 3
    # non-ASCII text and a lone surrogate (JSON allows "\ud800") still get keys
    odd = row_keys(ns(), texts([["é", "日本"], ["\ud800", "x"], ["e\u0301", "日本"]]))
    assert len(set(odd)) == 3


def test_mixed_numeric_and_string_inputs() -> None:
    numeric = np.asarray([[1.0, 2.0], [1.0, 2.0], [1.0, 2.5]], dtype=np.float32)
    categorical = np.asarray([["FR", "vip"], ["DE", "vip"], ["FR", "vip"]], dtype=object)
    keys = row_keys(ns(), {"numeric": numeric, "categorical": categorical})
    assert len(set(keys)) == 3
    again = row_keys(ns(), {"numeric": numeric[[0]], "categorical": categorical[[0]]})
    assert again[0] == keys[0]


def test_rank_one_and_bool_inputs() -> None:
    flags = np.asarray([True, False, True])
    counts = np.asarray([3, 3, 3], dtype=np.int64)
    keys = row_keys(ns(), {"flag": flags, "count": counts})
    assert keys[0] == keys[2] != keys[1]


def test_a_non_contiguous_input_keys_as_its_values() -> None:
    wide = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = wide[:, ::2]  # strided
    assert not view.flags.c_contiguous
    assert row_keys(ns(), {"input": view}) == row_keys(ns(), {"input": view.copy()})


def test_inputs_of_unequal_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="has 1 rows, not 2"):
        row_keys(ns(), {"a": np.zeros((2, 1), np.float32), "b": np.zeros((1, 1), np.float32)})


def test_no_rows_no_keys() -> None:
    assert row_keys(ns(), {"input": np.zeros((0, 3), np.float32)}) == []
    assert row_keys(ns(), {"t": np.zeros((0, 2), dtype=object)}) == []
