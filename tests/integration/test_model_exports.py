"""Models exported as users export them: skl2onnx's default options, ZipMap on.

Runtime returns such a classifier's probabilities as one ``{class: probability}`` dict per
row, with int keys that orjson refuses; a worker must still publish plain score lists, and
a model whose outputs cannot be published must stop the worker at start-up, before it
joins its group, not crash it on every live batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import orjson
import pytest
from onnx import TensorProto, helper

from streamfer_dev.harness import (
    WorkerProcess,
    collect_outcomes,
    committed_offsets,
    produce_requests,
    wait_for_assignment,
    worker_config_toml,
)
from streamfer_dev.modelgen import DemoModel
from tests.conftest import Topics
from tests.integration.helpers import assert_committed_to_end, assert_valid, streamfer, validator

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Export:
    path: Path
    classifier: Any
    """The fitted scikit-learn model, to compare scores with ``predict_proba``."""


@pytest.fixture(scope="module")
def default_export(model: DemoModel, tmp_path_factory: pytest.TempPathFactory) -> Export:
    """The demo's random forest on the demo's data, converted with skl2onnx's defaults."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import RandomForestClassifier

    target = load_breast_cancer().target
    clf = RandomForestClassifier(n_estimators=16, max_depth=6, random_state=0, n_jobs=1)
    clf.fit(model.features, target)
    path = tmp_path_factory.mktemp("exports") / "default.onnx"
    path.write_bytes(to_onnx(clf, model.features[:1]).SerializeToString())
    outputs = onnxruntime.InferenceSession(str(path)).get_outputs()
    assert [o.type for o in outputs] == ["tensor(int64)", "seq(map(int64,tensor(float)))"]
    return Export(path, clf)


def _config(
    kafka_bootstrap: str, redis_url: str, t: Topics, model: DemoModel, path: Path, out: Path
) -> Path:
    out.write_text(
        worker_config_toml(
            bootstrap=kafka_bootstrap,
            redis_url=redis_url,
            group=t.group,
            request_topic=t.requests,
            result_topic=t.results,
            dead_letter_topic=t.dead_letters,
            model_path=path,
            fields=model.fields,
            max_batch_size=64,
            max_wait_ms=10,
            model_name="breast-cancer-rf-zipmap",
        )
    )
    return out


def test_worker_publishes_scores_of_a_default_export(
    kafka_bootstrap: str,
    redis_url: str,
    entities: list[str],
    model: DemoModel,
    default_export: Export,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    t = fresh_topics(4)
    config = _config(kafka_bootstrap, redis_url, t, model, default_export.path, tmp_path / "w.toml")
    rows = {f"z{i}": i % len(entities) for i in range(1500)}
    requests = [
        (rid, entities[row].encode(), orjson.dumps({"id": rid, "entity": entities[row]}))
        for rid, row in rows.items()
    ]
    worker = WorkerProcess(config, tmp_path / "worker.log").start()
    try:
        wait_for_assignment([worker], 4, timeout=60)
        produce_requests(kafka_bootstrap, t.requests, requests)
        outcomes = collect_outcomes(
            kafka_bootstrap, t.results, t.dead_letters, set(rows), timeout=90, keep_docs=True
        )
    finally:
        code = worker.terminate()
    assert code == 0, worker.log_text()[-3000:]
    assert outcomes.lost(rows) == [], worker.log_text()[-3000:]
    assert outcomes.dead_letter_docs == []
    assert set(outcomes.results) == set(rows)
    assert outcomes.duplicates() == 0

    clf = default_export.classifier
    expected = clf.predict_proba(model.features)
    labels = clf.predict(model.features)
    schema = validator("result")
    for doc in outcomes.result_docs:
        scores = doc["outputs"]["scores"]
        assert isinstance(scores, list) and len(scores) == 2, doc
        assert all(isinstance(s, float) for s in scores), doc
        assert sum(scores) == pytest.approx(1.0, abs=1e-5), doc
        row = rows[doc["id"]]
        np.testing.assert_allclose(scores, expected[row], atol=1e-5)
        assert doc["outputs"]["label"] == labels[row], doc
        assert doc["model"]["name"] == "breast-cancer-rf-zipmap"
    for doc in outcomes.result_docs[::25]:
        assert_valid(schema, doc)
    assert_committed_to_end(kafka_bootstrap, t.group, t.requests)


def _batch_total_model(path: Path, width: int) -> Path:
    """A model with a label per row and a ``total`` over the whole batch: one value that
    is no request's result."""
    nodes = [
        helper.make_node("ArgMax", ["X"], ["label"], axis=1, keepdims=0),
        helper.make_node("ReduceSum", ["X"], ["total"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "batch_total",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, width])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
        ],
    )
    onx = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onx.ir_version = 8
    path.write_bytes(onx.SerializeToString())
    return path


def test_unpublishable_model_fails_start_up_not_the_first_batch(
    kafka_bootstrap: str,
    redis_url: str,
    entities: list[str],
    model: DemoModel,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    t = fresh_topics(2)
    bad = _batch_total_model(tmp_path / "total.onnx", len(model.fields))
    config = _config(kafka_bootstrap, redis_url, t, model, bad, tmp_path / "w.toml")
    check = streamfer("check", "--config", str(config))
    assert check.returncode == 2, check.stdout + check.stderr
    assert "output 'total' (total) cannot be published" in check.stderr
    ids = {f"u{i}" for i in range(20)}
    produce_requests(
        kafka_bootstrap,
        t.requests,
        [(i, None, orjson.dumps({"id": i, "entity": entities[0]})) for i in sorted(ids)],
    )
    run = streamfer("run", "--config", str(config), "--burst-idle-s", "3", timeout=120)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "output 'total' (total) cannot be published" in run.stderr, run.stderr[-3000:]
    outcomes = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, ids, timeout=3)
    assert outcomes.results == {} and outcomes.dead_letters == {}
    assert all(off < 0 for off in committed_offsets(kafka_bootstrap, t.group, t.requests).values())
