"""CSV rows into model inputs: widths in the model's input order, parsing per input type,
and errors that name the file, line and column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from worker.errors import ConfigError
from worker.inference.engine import ONNX_DTYPES, TensorInput
from worker.tools.model_rows import ModelRows, read_model_rows


def tensor(name: str, onnx_type: str, width: int | None, rank: int = 2) -> TensorInput:
    return TensorInput(name, onnx_type, ONNX_DTYPES.get(onnx_type), rank, width)


NUMERIC = tensor("numeric", "tensor(float)", 2)
TEXT = tensor("categorical", "tensor(string)", 1)


def write(tmp_path: Path, text: str, name: str = "rows.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_columns_fill_the_inputs_in_the_model_order(tmp_path: Path) -> None:
    ids = tensor("ids", "tensor(int64)", 1, rank=1)
    flags = tensor("flags", "tensor(bool)", 2)
    path = write(
        tmp_path,
        'a,b,country,id,f1,f2\n1.5,-2e3,FR,7,true,0\n\n0,3,"S, A",-9,False,1\n',
    )
    rows = read_model_rows(path, [NUMERIC, TEXT, ids, flags])
    assert rows.count == 2  # the blank line is no row
    assert rows.feeds["numeric"].dtype == np.float32
    assert rows.feeds["numeric"].tolist() == [[1.5, -2000.0], [0.0, 3.0]]
    assert rows.feeds["categorical"].dtype == object
    assert rows.feeds["categorical"].tolist() == [["FR"], ["S, A"]]
    assert rows.feeds["ids"].shape == (2,) and rows.feeds["ids"].tolist() == [7, -9]
    assert rows.feeds["flags"].tolist() == [[True, False], [False, True]]


def test_the_input_with_an_open_width_takes_the_columns_left(tmp_path: Path) -> None:
    path = write(tmp_path, "x,y,z,w,s\n1,2,3,4,a\n")
    rows = read_model_rows(path, [tensor("x", "tensor(double)", None), TEXT])
    assert rows.feeds["x"].dtype == np.float64 and rows.feeds["x"].shape == (1, 4)


def test_two_open_widths_cannot_be_told_apart(tmp_path: Path) -> None:
    path = write(tmp_path, "a,b,c\n1,2,3\n")
    open_ = [tensor("a", "tensor(float)", None), tensor("b", "tensor(float)", None)]
    with pytest.raises(ConfigError, match=r"inputs \['a', 'b'\] all leave their width open"):
        read_model_rows(path, open_)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b\n1,2\n", r"rows.csv: the header has 2 columns; the model's inputs \(numeric "),
        ("a,b,c\n1,2,x\n3,4\n", r"rows.csv: line 3 has 2 columns, the header has 3"),
        ("a,b,c\n1,2,x\n3,oops,y\n", r"line 3, column 2 \('b'\): 'oops' is not a number"),
        ("a,b,c\n1,2,x\n3,inf,y\n", r"line 3, column 2 \('b'\): 'inf' is not finite"),
        ("a,b,c\n", r"rows.csv: no rows after the header"),
        ("", r"rows.csv: the file is empty"),
    ],
    ids=["header width", "row width", "not a number", "not finite", "no rows", "empty"],
)
def test_bad_rows_name_the_file_line_and_column(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_model_rows(write(tmp_path, text), [NUMERIC, TEXT])


def test_integer_and_bool_inputs_refuse_what_they_cannot_hold(tmp_path: Path) -> None:
    small = tensor("small", "tensor(int8)", 1)
    with pytest.raises(ConfigError, match=r"line 3, column 1 \('n'\): '1.5' is not an integer"):
        read_model_rows(write(tmp_path, "n\n2\n1.5\n"), [small])
    with pytest.raises(ConfigError, match=r"'300' is not an integer that fits int8"):
        read_model_rows(write(tmp_path, "n\n300\n"), [small])
    with pytest.raises(ConfigError, match=r"'yes' is not a bool"):
        read_model_rows(write(tmp_path, "f\nyes\n"), [tensor("f", "tensor(bool)", 1)])


def test_a_missing_file_and_an_input_rows_cannot_fill(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nowhere.csv: no such file"):
        read_model_rows(tmp_path / "nowhere.csv", [NUMERIC])
    image = tensor("image", "tensor(float)", None, rank=4)
    with pytest.raises(ConfigError, match=r"input 'image' has rank 4"):
        read_model_rows(write(tmp_path, "a\n1\n"), [image])


def test_every_fifth_row_is_held_out_and_a_batch_cycles_through_the_rows() -> None:
    rows = ModelRows({"x": np.arange(12, dtype=np.float32).reshape(12, 1)}, 12)
    kept, held = rows.split_every(5)
    assert held.feeds["x"].ravel().tolist() == [4, 9]
    assert kept.count == 10 and 4 not in kept.feeds["x"]
    assert rows.tiled(30)["x"].ravel().tolist()[10:14] == [10, 11, 0, 1]
    assert [len(b["x"]) for b in rows.batches(5)] == [5, 5, 2]
