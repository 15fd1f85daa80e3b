"""``worker.tools.model_check``: node order restored after ONNX Runtime's FP16 converter
(which appends the Casts it adds after the nodes reading them), on a
real skl2onnx export and on a graph whose subgraph reads a later node's output, and the
full ``onnx.checker`` run on a written file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from tests.fakes.onnx_models import helper_mlp, sklearn_mlp
from worker.errors import EngineError
from worker.tools.model_check import check_model_file, sort_nodes


def _fp16(path: Path) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = onnx.load(str(path))
    blocked = set(DEFAULT_OP_BLOCK_LIST) | {
        n.op_type for n in model.graph.node if n.domain == "ai.onnx.ml"
    }
    converted: onnx.ModelProto = convert_float_to_float16(
        model, keep_io_types=True, op_block_list=sorted(blocked)
    )
    return converted


@pytest.mark.parametrize("make", [sklearn_mlp, helper_mlp], ids=["skl2onnx", "onnx.helper"])
def test_the_fp16_converters_output_is_sorted_back(
    make: Callable[[Path], tuple[Path, Any]], tmp_path: Path
) -> None:
    path, _ = make(tmp_path / "model.onnx")
    model = _fp16(path)
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(model, full_check=True)
    before = [n.name for n in model.graph.node]
    sort_nodes(model.graph)
    onnx.checker.check_model(model, full_check=True)
    after = [n.name for n in model.graph.node]
    assert sorted(after) == sorted(before) and after != before


def test_a_sorted_graph_keeps_its_order(tmp_path: Path) -> None:
    path, _ = helper_mlp(tmp_path / "model.onnx")
    model = onnx.load(str(path))
    before = list(model.graph.node)
    sort_nodes(model.graph)
    assert list(model.graph.node) == before


def _branch(name: str, reads: str) -> onnx.GraphProto:
    """A branch whose two nodes are out of order, the second reading ``reads`` from the
    enclosing graph."""
    return helper.make_graph(
        [
            helper.make_node("Neg", [f"{name}_t"], [f"{name}_out"], name=f"{name}_neg"),
            helper.make_node("Identity", [reads], [f"{name}_t"], name=f"{name}_id"),
        ],
        name,
        [],
        [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2])],
    )


def test_a_subgraphs_read_of_an_outer_name_orders_its_node() -> None:
    """``If`` names no input for ``doubled``, which its branches read; the Mul making it
    comes after the If, and each branch is itself out of order."""
    graph = helper.make_graph(
        [
            helper.make_node(
                "If",
                ["flag"],
                ["y"],
                name="if",
                then_branch=_branch("then", "doubled"),
                else_branch=_branch("else", "doubled"),
            ),
            helper.make_node("Mul", ["x", "two"], ["doubled"], name="mul"),
        ],
        "main",
        [
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model, full_check=True)
    sort_nodes(model.graph)
    assert [n.name for n in model.graph.node] == ["mul", "if"]
    branches = [a.g for a in model.graph.node[1].attribute]
    assert [[n.op_type for n in g.node] for g in branches] == [["Identity", "Neg"]] * 2
    onnx.checker.check_model(model, full_check=True)


def test_a_file_failing_the_checker_is_named(tmp_path: Path) -> None:
    path, _ = sklearn_mlp(tmp_path / "model.onnx")
    unsorted = tmp_path / "model.fp16.onnx"
    onnx.save(_fp16(path), str(unsorted))
    with pytest.raises(EngineError) as caught:
        check_model_file(unsorted, f"{unsorted} (a copy)")
    message = str(caught.value)
    assert message.startswith(f"{unsorted} (a copy) fails onnx.checker (full check): ")
    assert "topologically sorted" in message
    check_model_file(path, "the export")  # skl2onnx's own file passes
