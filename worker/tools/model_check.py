"""Node order and ``onnx.checker`` for the model files the tools write.

ONNX Runtime's FP16 converter appends the Casts it adds (for the float32 inputs and
outputs it keeps, and around ops left float32) at the end of the graph, after nodes that
read them. ONNX Runtime loads such a
graph (it sorts on load), but the ONNX standard requires topological order, and
``onnx.checker`` and tools that walk nodes in order refuse it. ``sort_nodes`` puts a
graph and its subgraphs back in order, keeping the original order wherever it already is
one; ``check_model_file`` runs the full checker (strict shape inference too) on a file
before a tool hands it over, so nothing it writes fails it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from worker.errors import EngineError

__all__ = ["check_model_file", "sort_nodes"]


def sort_nodes(graph: Any) -> None:
    """Reorder ``graph``'s nodes (an ``onnx.GraphProto``, changed in place) so each comes
    after the nodes whose outputs it reads, a subgraph's reads of this graph's names
    included, and sort its subgraphs too. Among nodes free to go, the earlier one goes
    first. Nodes in a cycle are left for the checker to report, in their order, at the
    end."""
    nodes = list(graph.node)
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    for node in nodes:
        for sub in _subgraphs(node):
            sort_nodes(sub)
    users: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, node in enumerate(nodes):
        for p in {producer[name] for name in _reads(node) if name in producer}:
            users[p].append(i)
            waiting[i] += 1
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    placed = set(order)
    order += [i for i in range(len(nodes)) if i not in placed]
    if order != list(range(len(nodes))):
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)


def check_model_file(path: Path, what: str) -> None:
    """Run ``onnx.checker`` with ``full_check`` on the file at ``path`` (read from disk,
    so models over 2 GB work too).

    Raises EngineError naming ``what`` (the file as the user knows it) and the checker's
    first line when the file fails.
    """
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EngineError(f"{what} fails onnx.checker (full check): {first[:300]}") from exc


def _defined(graph: Any) -> set[str]:
    return (
        {v.name for v in graph.input}
        | {t.name for t in graph.initializer}
        | {t.values.name for t in graph.sparse_initializer}
    )


def _subgraphs(node: Any) -> Iterator[Any]:
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def _reads(node: Any) -> set[str]:
    """The node's inputs and the enclosing scope's names its subgraphs read."""
    names = {name for name in node.input if name}
    for sub in _subgraphs(node):
        names |= _outer_reads(sub)
    return names


def _outer_reads(graph: Any) -> set[str]:
    """Names ``graph`` (and its subgraphs) read but do not define."""
    local = _defined(graph) | {name for node in graph.node for name in node.output}
    return {name for node in graph.node for name in _reads(node)} - local
