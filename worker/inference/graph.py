"""What the worker reads from an ONNX graph itself, beyond what ONNX Runtime tells it.

ONNX Runtime does not expose the graph, so it is read again with ``onnx`` (without
external weights), and only for what Runtime cannot say:

- ``zipmap_classes``: the class labels of each ZipMap output, in the model's order;
- ``string_examples``: for each column of a string input, one category the model
  accepts. A scikit-learn ``OneHotEncoder`` exported with its default
  ``handle_unknown="error"`` fails on any string it was not fitted on, so warm-up and
  ``streamfer check`` feed a category read from the encoder (or label encoder) that
  consumes the column, followed through the Gather, Concat, Reshape and Identity nodes
  skl2onnx puts between them.

``onnx`` is not a dependency of the worker: without it both answer nothing, and the
engine falls back to Runtime's sorted class order and to empty strings.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from worker.errors import EngineError

__all__ = ["string_examples", "zipmap_classes"]

log = logging.getLogger(__name__)

Column = tuple[str, int]
"""(graph input name, column)"""

_PASS_THROUGH = frozenset({"Identity", "Reshape", "Cast", "Flatten", "Squeeze", "Unsqueeze"})
_CATEGORY_ATTRS = ("cats_strings", "keys_strings", "classes_strings")


def _graph(path: Path) -> Any:
    try:
        import onnx
    except ImportError:
        log.info("model %s: onnx is not installed; the graph is not read", path)
        return None
    try:
        return onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # onnx raises protobuf's untyped errors
        raise EngineError(f"cannot read the graph of model {path}: {exc}") from exc


def zipmap_classes(path: Path) -> dict[str, list[int | str]]:
    """Each ZipMap node's output name -> its class labels, in the model's order.

    Without ``onnx`` the columns follow Runtime's map key order, which is sorted: the
    model's class order for skl2onnx's exports, whose labels are sklearn's sorted
    ``classes_``; a model whose ZipMap declares its classes in another order needs
    ``onnx`` installed to get its columns in that order.
    """
    graph = _graph(path)
    if graph is None:
        return {}
    found: dict[str, list[int | str]] = {}
    for node in graph.node:
        if node.op_type != "ZipMap":
            continue
        attrs = {a.name: a for a in node.attribute}
        labels: list[int | str]
        if "classlabels_int64s" in attrs:
            labels = list(attrs["classlabels_int64s"].ints)
        elif "classlabels_strings" in attrs:
            labels = [s.decode("utf-8") for s in attrs["classlabels_strings"].strings]
        else:
            continue
        for out in node.output:
            found[out] = labels
    return found


def string_examples(path: Path, widths: dict[str, int]) -> dict[str, list[str]]:
    """For each string input named in ``widths`` (name -> columns), a value per column
    that the model's encoders accept; "" where no encoder is found. A model without
    string inputs is not read (parsing the graph costs a worker ~15 MB of RSS)."""
    if not widths:
        return {}
    graph = _graph(path)
    if graph is None:
        return {}
    constants = _int_constants(graph)
    columns: dict[str, list[Column | None]] = {
        name: [(name, c) for c in range(width)] for name, width in widths.items()
    }
    found: dict[Column, str] = {}
    for node in graph.node:
        sources = [columns.get(name) for name in node.input]
        if not node.input or sources[0] is None:
            continue
        first = sources[0]
        op = node.op_type
        out: list[Column | None] | None = None
        if op in _PASS_THROUGH:
            out = first
        elif op in ("Gather", "ArrayFeatureExtractor") and len(node.input) > 1:
            axis = _int_attr(node, "axis", 0 if op == "Gather" else -1)
            picked = constants.get(node.input[1])
            if picked is not None and axis in (1, -1):
                out = [first[i] if -len(first) <= i < len(first) else None for i in picked]
        elif op == "Concat" and all(s is not None for s in sources):
            out = [c for s in sources for c in s]  # type: ignore[union-attr]
        else:
            categories = _categories(node)
            if categories:
                for column in first:
                    if column is not None:
                        found.setdefault(column, categories[0])
        if out is not None:
            for name in node.output:
                columns[name] = out
    return {name: [found.get((name, c), "") for c in range(w)] for name, w in widths.items()}


def _categories(node: Any) -> list[str]:
    for attr in node.attribute:
        if attr.name in _CATEGORY_ATTRS and attr.strings:
            return [s.decode("utf-8", "replace") for s in attr.strings]
    return []


def _int_attr(node: Any, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


def _int_constants(graph: Any) -> dict[str, list[int]]:
    """Integer initializers and Constant outputs, flattened: Gather's column indices."""
    from onnx import numpy_helper

    found: dict[str, list[int]] = {}
    for tensor in graph.initializer:
        if tensor.data_type in (6, 7):  # INT32, INT64
            found[tensor.name] = [int(v) for v in numpy_helper.to_array(tensor).ravel()]
    for node in graph.node:
        if node.op_type != "Constant":
            continue
        for attr in node.attribute:
            if attr.name == "value" and attr.t.data_type in (6, 7):
                values = numpy_helper.to_array(attr.t).ravel()
                found[node.output[0]] = [int(v) for v in values]
    return found
