"""The ONNX Runtime engine on the demo classifier (built once per session, ~3 s), and on
models that scikit-learn trains and skl2onnx exports here with default options (ZipMap on),
as users export theirs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime
import orjson
import pytest
from onnx import TensorProto, helper

from streamfer_dev.modelgen import DemoModel
from worker.config import ModelSpec
from worker.errors import EngineError
from worker.inference.engine import ENGINES, OnnxEngine, file_sha256, is_device_oom, warm_up_sizes

SpecFactory = Callable[..., ModelSpec]


@pytest.fixture
def make_spec(classifier: DemoModel) -> SpecFactory:
    def make(**kw: Any) -> ModelSpec:
        args: dict[str, Any] = {"path": classifier.path, "name": "demo"}
        args.update(kw)
        return ModelSpec(**args)

    return make


@pytest.fixture(scope="module")
def engine(classifier: DemoModel) -> OnnxEngine:
    return OnnxEngine(ModelSpec(path=classifier.path, name="demo"))


def test_classifier_outputs(engine: OnnxEngine, classifier: DemoModel) -> None:
    batch = classifier.features[:8]
    out = engine.infer(batch)
    assert set(out) == {"label", "scores"}
    labels, scores = out["label"], out["scores"]
    assert labels.shape == (8,)
    assert labels.dtype.kind == "i"
    assert set(labels.tolist()) <= {0, 1}
    assert scores.shape == (8, 2)
    assert scores.dtype == np.float32
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, rtol=1e-5)
    # the label is the most probable class
    np.testing.assert_array_equal(labels, scores.argmax(axis=1))


def test_model_fits_its_training_data(engine: OnnxEngine, classifier: DemoModel) -> None:
    from sklearn.datasets import load_breast_cancer

    target = load_breast_cancer().target
    labels = engine.infer(classifier.features)["label"]
    assert labels.shape == target.shape
    assert (labels == target).mean() > 0.9


def test_metadata(engine: OnnxEngine, classifier: DemoModel) -> None:
    assert [(t.name, t.width, t.dtype) for t in engine.inputs] == [("X", 30, np.float32)]
    assert len(classifier.fields) == 30
    assert engine.model_hash == file_sha256(classifier.path)
    assert len(engine.model_hash) == 64
    assert "CPUExecutionProvider" in engine.providers


def test_single_row_and_warm_up(
    engine: OnnxEngine, classifier: DemoModel, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="worker.inference.engine"):
        engine.warm_up([1, 3, 64])
    assert f"model {classifier.path.name} warmed at batch sizes [1, 3, 64] in " in caplog.text
    out = engine.infer(classifier.features[:1])
    assert out["scores"].shape == (1, 2)


def test_warm_up_covers_every_power_of_two_and_the_maximum() -> None:
    assert warm_up_sizes(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert warm_up_sizes(100) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert warm_up_sizes(1) == [1]


def test_wrong_width_is_engine_error(engine: OnnxEngine) -> None:
    with pytest.raises(EngineError, match="model run failed on 2 rows"):
        engine.infer(np.zeros((2, 5), dtype=np.float32))


def test_wrong_dtype_is_engine_error(engine: OnnxEngine) -> None:
    with pytest.raises(EngineError):
        engine.infer(np.zeros((2, 30), dtype=np.float64))  # type: ignore[arg-type]


def test_missing_model_file_names_path(make_spec: SpecFactory, tmp_path: Path) -> None:
    missing = tmp_path / "absent.onnx"
    with pytest.raises(EngineError, match="model file not found") as info:
        OnnxEngine(make_spec(path=missing))
    assert str(missing) in str(info.value)


def test_sha256_pin_mismatch(make_spec: SpecFactory, classifier: DemoModel) -> None:
    with pytest.raises(EngineError, match="but the config pins") as info:
        OnnxEngine(make_spec(sha256="0" * 64))
    assert file_sha256(classifier.path) in str(info.value)


def test_sha256_pin_match(make_spec: SpecFactory, classifier: DemoModel) -> None:
    digest = file_sha256(classifier.path)
    engine = OnnxEngine(make_spec(sha256=digest.upper()))
    assert engine.model_hash == digest


def test_no_available_provider(make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    spec = make_spec(providers=["CUDAExecutionProvider", "TensorrtExecutionProvider"])
    with pytest.raises(EngineError, match="none of the execution providers") as info:
        OnnxEngine(spec)
    assert "CUDAExecutionProvider" in str(info.value)


def test_unavailable_provider_falls_back(
    make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    engine = OnnxEngine(make_spec(providers=["CUDAExecutionProvider", "CPUExecutionProvider"]))
    assert engine.providers == ["CPUExecutionProvider"]


def test_corrupt_model_file(make_spec: SpecFactory, tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(EngineError, match="cannot load model"):
        OnnxEngine(make_spec(path=bad))


def test_configured_outputs(make_spec: SpecFactory, classifier: DemoModel) -> None:
    engine = OnnxEngine(make_spec(outputs={"p": "probabilities"}))
    out = engine.infer(classifier.features[:3])
    assert list(out) == ["p"]
    assert out["p"].shape == (3, 2)


def test_configured_unknown_output(make_spec: SpecFactory) -> None:
    with pytest.raises(EngineError, match=r"has no outputs \['nope'\]"):
        OnnxEngine(make_spec(outputs={"x": "nope"}))


def test_engine_registry() -> None:
    assert ENGINES["onnxruntime"] is OnnxEngine


# Models exported with skl2onnx's defaults: ZipMap on, so Runtime returns the scores as
# one {class: probability} dict per row.

Data = tuple[npt.NDArray[np.float32], npt.NDArray[Any]]


def _breast_cancer(labels: list[Any] | None = None) -> Data:
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = data.data.astype(np.float32)
    return x, data.target if labels is None else np.array(labels)[data.target]


def _iris(labels: list[Any]) -> Data:
    from sklearn.datasets import load_iris

    data = load_iris()
    return data.data.astype(np.float32), np.array(labels)[data.target]


def _logistic() -> Any:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))


def _forest() -> Any:
    from sklearn.ensemble import RandomForestClassifier

    return RandomForestClassifier(n_estimators=8, max_depth=5, random_state=0, n_jobs=1)


CLASSIFIERS: dict[str, tuple[Callable[[], Any], Callable[[], Data]]] = {
    "binary-int": (_logistic, _breast_cancer),
    "multiclass-int": (_logistic, lambda: _iris([9, 3, 7])),
    "negative-int": (_logistic, lambda: _iris([10, -5, 2])),
    "binary-str": (_logistic, lambda: _breast_cancer(["dog", "cat"])),
    "multiclass-str": (_logistic, lambda: _iris(["zebra", "Ant", "\u00e9mu"])),
    "forest": (_forest, _breast_cancer),
    "forest-multiclass-str": (_forest, lambda: _iris(["b", "c", "a"])),
}


def _export(model: Any, x: npt.NDArray[np.float32], path: Path, **options: Any) -> Path:
    from skl2onnx import to_onnx

    onx = to_onnx(model, x[:1].astype(np.float32), **options)
    path.write_bytes(onx.SerializeToString())
    return path


@pytest.fixture(scope="module")
def exported(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], tuple[Any, Data, OnnxEngine]]:
    """Factory: train a classifier of ``CLASSIFIERS``, export it with default options and
    load it; each is built once per module."""
    built: dict[str, tuple[Any, Data, OnnxEngine]] = {}

    def get(case: str) -> tuple[Any, Data, OnnxEngine]:
        if case not in built:
            make_model, make_data = CLASSIFIERS[case]
            x, y = make_data()
            model = make_model().fit(x, y)
            path = _export(model, x, tmp_path_factory.mktemp(case) / "m.onnx")
            built[case] = (model, (x, y), OnnxEngine(ModelSpec(path=path, name=case)))
        return built[case]

    return get


def _publish_rows(out: dict[str, Any]) -> list[bytes]:
    """Each row's outputs encoded as the pipeline does: ``tolist`` then orjson."""
    cols = {name: values.tolist() for name, values in out.items()}
    n = len(next(iter(cols.values())))
    return [orjson.dumps({name: col[i] for name, col in cols.items()}) for i in range(n)]


@pytest.mark.parametrize("case", sorted(CLASSIFIERS))
def test_default_export_gives_scores_in_class_order(
    exported: Callable[[str], tuple[Any, Data, OnnxEngine]], case: str
) -> None:
    model, (x, _y), engine = exported(case)
    assert [o.type for o in engine._session.get_outputs()][1].startswith("seq(map(")
    out = engine.infer(x)
    assert set(out) == {"label", "scores"}
    labels, scores = out["label"], out["scores"]
    n_classes = len(model.classes_)
    assert scores.shape == (len(x), n_classes)
    assert scores.dtype == np.float32
    np.testing.assert_allclose(scores, model.predict_proba(x), atol=1e-5)
    assert labels.shape == (len(x),)
    assert labels.tolist() == model.predict(x).tolist()
    assert all(type(v) is type(model.classes_[0].item()) for v in labels.tolist())
    # the label is the class of the highest score, so columns follow classes_
    assert (model.classes_[scores.argmax(axis=1)] == labels).mean() > 0.99


@pytest.mark.parametrize("case", sorted(CLASSIFIERS))
def test_default_export_rows_encode_as_json(
    exported: Callable[[str], tuple[Any, Data, OnnxEngine]], case: str
) -> None:
    model, (x, _y), engine = exported(case)
    engine.warm_up([1, 2, 64])
    rows = _publish_rows(engine.infer(x[:50]))
    assert len(rows) == 50
    for row, expected in zip(rows, model.predict_proba(x[:50]), strict=True):
        doc = orjson.loads(row)
        np.testing.assert_allclose(doc["scores"], expected, atol=1e-5)
        assert doc["label"] in model.classes_.tolist()


def test_zipmap_off_and_on_give_the_same_outputs(
    exported: Callable[[str], tuple[Any, Data, OnnxEngine]], tmp_path: Path
) -> None:
    model, (x, _y), zipmap_on = exported("multiclass-int")
    path = _export(model, x, tmp_path / "off.onnx", options={"zipmap": False})
    zipmap_off = OnnxEngine(ModelSpec(path=path, name="off"))
    assert [o.name for o in zipmap_off._session.get_outputs()] == ["label", "probabilities"]
    on, off = zipmap_on.infer(x), zipmap_off.infer(x)
    assert set(on) == set(off) == {"label", "scores"}
    np.testing.assert_array_equal(on["label"], off["label"])
    np.testing.assert_allclose(on["scores"], off["scores"], atol=1e-6)
    np.testing.assert_allclose(off["scores"], model.predict_proba(x), atol=1e-5)
    zipmap_off.warm_up([1, 8])


def test_configured_zipmap_output(
    exported: Callable[[str], tuple[Any, Data, OnnxEngine]],
) -> None:
    model, (x, _y), engine = exported("binary-str")
    spec = ModelSpec(path=engine._path, name="p", outputs={"p": "output_probability"})
    only_scores = OnnxEngine(spec)
    out = only_scores.infer(x[:5])
    assert list(out) == ["p"]
    np.testing.assert_allclose(out["p"], model.predict_proba(x[:5]), atol=1e-5)


def test_regressor_default_export(tmp_path: Path) -> None:
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = _breast_cancer()
    model = make_pipeline(StandardScaler(), Ridge()).fit(x, y.astype(np.float64))
    engine = OnnxEngine(ModelSpec(path=_export(model, x, tmp_path / "r.onnx"), name="r"))
    engine.warm_up([1, 4])
    out = engine.infer(x)
    assert list(out) == ["variable"]
    assert out["variable"].shape == (len(x), 1)
    assert out["variable"].dtype == np.float32
    np.testing.assert_allclose(out["variable"][:, 0], model.predict(x), rtol=1e-4, atol=1e-4)
    assert orjson.loads(_publish_rows(out)[0])["variable"] == [float(out["variable"][0, 0])]


def _zipmap_model(path: Path, labels: list[int] | list[str]) -> Path:
    """A model that hands its input to a ZipMap whose class labels are not sorted, as a
    converter other than skl2onnx may write them: column i is class ``labels[i]``."""
    attr = "classlabels_int64s" if isinstance(labels[0], int) else "classlabels_strings"
    key = TensorProto.INT64 if isinstance(labels[0], int) else TensorProto.STRING
    node = helper.make_node("ZipMap", ["X"], ["probs"], domain="ai.onnx.ml", **{attr: labels})
    graph = helper.make_graph(
        [node],
        "zipmap",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, len(labels)])],
        [
            helper.make_value_info(
                "probs",
                helper.make_sequence_type_proto(
                    helper.make_map_type_proto(
                        key, helper.make_tensor_type_proto(TensorProto.FLOAT, [])
                    )
                ),
            )
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("labels", [[9, 3, 7], ["dog", "cat", "ant"]], ids=["int", "str"])
def test_zipmap_columns_follow_the_models_class_order(
    tmp_path: Path, labels: list[int] | list[str]
) -> None:
    engine = OnnxEngine(ModelSpec(path=_zipmap_model(tmp_path / "z.onnx", labels), name="z"))
    rng = np.random.default_rng(0)
    for rows in (5, 3):  # the second batch reuses the column order found for the first
        x = rng.random((rows, 3), dtype=np.float32)
        out = engine.infer(x)
        assert list(out) == ["probs"]
        np.testing.assert_array_equal(out["probs"], x)
    engine.warm_up([1, 2])


@pytest.mark.parametrize("labels", [[9, 3, 7], ["dog", "cat", "ant"]], ids=["int", "str"])
def test_zipmap_without_onnx_gives_columns_in_sorted_class_order(
    tmp_path: Path, labels: list[int] | list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnx is not a runtime dependency: without it the ZipMap's declared labels are
    unknown and the columns keep Runtime's sorted key order."""
    path = _zipmap_model(tmp_path / "z.onnx", labels)
    monkeypatch.setitem(sys.modules, "onnx", None)  # ``import onnx`` raises ImportError
    engine = OnnxEngine(ModelSpec(path=path, name="z"))
    x = np.random.default_rng(0).random((5, 3), dtype=np.float32)
    order = sorted(range(len(labels)), key=lambda i: labels[i])
    np.testing.assert_array_equal(engine.infer(x)["probs"], x[:, order])
    engine.warm_up([1, 2])


@pytest.mark.parametrize("case", ["multiclass-int", "negative-int", "multiclass-str"])
def test_default_export_without_onnx_gives_the_same_outputs(
    exported: Callable[[str], tuple[Any, Data, OnnxEngine]],
    case: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """skl2onnx writes sklearn's sorted classes, so Runtime's order is the model's."""
    model, (x, _y), engine = exported(case)
    monkeypatch.setitem(sys.modules, "onnx", None)
    without = OnnxEngine(ModelSpec(path=engine._path, name=case)).infer(x)
    np.testing.assert_array_equal(without["label"], engine.infer(x)["label"])
    np.testing.assert_allclose(without["scores"], model.predict_proba(x), atol=1e-5)


def test_zipmap_with_other_classes_than_declared_is_engine_error(
    exported: Callable[[str], tuple[Any, Data, OnnxEngine]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _model, (x, _y), engine = exported("multiclass-int")
    labels, _ = engine._run(None, {engine.inputs[0].name: x[:2]})
    odd = [{3: 0.5, 7: 0.5, 8: 0.0}] * 2
    monkeypatch.setattr(engine, "_run", lambda names, feeds: [labels, odd])
    with pytest.raises(EngineError, match="cannot convert output 'scores' of 2 rows") as info:
        engine.infer(x[:2])
    assert "[3, 7, 8]" in str(info.value)


def test_warm_up_refuses_what_the_pipeline_could_not_publish(
    exported: Callable[[str], tuple[Any, Data, OnnxEngine]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the engine gave before ZipMap outputs were converted: dicts with int keys,
    which orjson refuses. Warm-up must fail, naming the output, not the first batch."""
    _model, _data, engine = exported("binary-int")
    monkeypatch.setattr(engine, "_converters", [np.asarray, np.asarray])
    with pytest.raises(EngineError, match=r"output 'scores' \(output_probability\)") as info:
        engine.warm_up([1, 4])
    assert "cannot be published: it holds dict values" in str(info.value)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (np.ones((4, 2), dtype=np.complex64), "its dtype complex64 is not a number"),
        (np.array([b"a"] * 4), "its dtype |S1 is not a number"),
        (np.array([{"a": 1.0}] * 4, dtype=object), "it holds dict values"),
        (np.array(["a", "b", "c", None], dtype=object), "it holds NoneType values"),
        (np.ones(3, dtype=np.float32), r"shape \(3,\) for 4 input rows"),
        (np.array(1.0, dtype=np.float32), r"shape \(\) for 4 input rows"),
        ([1.0, 2.0, 3.0, 4.0], "it is a list, not an array"),
    ],
    ids=["complex", "bytes", "dicts", "none", "rows", "scalar", "list"],
)
def test_warm_up_names_what_is_wrong(
    make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch, value: Any, why: str
) -> None:
    engine = OnnxEngine(make_spec(outputs={"odd": "probabilities"}))
    monkeypatch.setattr(engine, "_converters", [lambda _v: value])
    with pytest.raises(EngineError, match="output 'odd' \\(probabilities\\) cannot be "):
        engine.warm_up([4])
    with pytest.raises(EngineError, match=why):
        engine.warm_up([4])


def test_warm_up_refuses_an_output_without_a_row_per_input(tmp_path: Path) -> None:
    """A real model whose second output sums over the whole batch: one value, not a row
    per request."""
    nodes = [
        helper.make_node("Identity", ["X"], ["Y"]),
        helper.make_node("ReduceSum", ["X"], ["total"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "sum",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 3]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "sum.onnx"
    path.write_bytes(model.SerializeToString())
    engine = OnnxEngine(ModelSpec(path=path, name="sum"))
    assert engine.infer(np.ones((2, 3), dtype=np.float32))["total"].shape == ()
    with pytest.raises(EngineError, match=r"output 'total' \(total\) cannot be published: it"):
        engine.warm_up([1, 2])


def test_warm_up_runs_at_least_once(
    make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = OnnxEngine(make_spec())
    monkeypatch.setattr(engine, "_converters", [np.asarray, lambda _v: np.float32(0)])
    with pytest.raises(EngineError, match="output 'scores'"):
        engine.warm_up([])


# --- several typed inputs, as scikit-learn pipelines export them -------------------------


@pytest.fixture(scope="module")
def two_input_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A OneHotEncoder + LogisticRegression pipeline over two string columns, exported
    with skl2onnx's defaults: ZipMap on, and OneHotEncoder's default
    handle_unknown="error", so Runtime refuses any category it was not fitted on (the
    empty string too). skl2onnx picks each column with a Gather before its encoder."""
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    rng = np.random.default_rng(3)
    cats = np.array([[rng.choice(["FR", "DE"]), rng.choice(["vip", "smb"])] for _ in range(200)])
    y = ((cats[:, 0] == "FR") ^ (rng.random(200) < 0.2)).astype(int)
    pipe = make_pipeline(OneHotEncoder(), LogisticRegression()).fit(cats, y)
    onx = to_onnx(pipe, initial_types=[("cat", StringTensorType([None, 2]))])
    path = tmp_path_factory.mktemp("two") / "two.onnx"
    path.write_bytes(onx.SerializeToString())
    return path


def test_string_inputs_warm_up_with_categories_read_from_the_graph(two_input_model: Path) -> None:
    engine = OnnxEngine(ModelSpec(path=two_input_model, name="two"))
    assert [t.describe() for t in engine.inputs] == ["cat string[batch, 2]"]
    example = engine.example()(2)
    # each column's encoder's first category
    assert example["cat"].tolist() == [["DE", "smb"], ["DE", "smb"]]
    engine.warm_up([1, 4])
    with pytest.raises(EngineError, match="Unknown Category"):
        engine.infer({"cat": np.array([["", ""]], dtype=object)})


def test_class_names_name_the_label(two_input_model: Path) -> None:
    spec = ModelSpec(path=two_input_model, name="two", class_names=["legit", "fraud"])
    engine = OnnxEngine(spec)
    feeds = engine.example()(3)
    plain = OnnxEngine(ModelSpec(path=two_input_model, name="two")).infer(feeds)["label"]
    named = engine.infer(feeds)["label"]
    assert named.tolist() == [["legit", "fraud"][i] for i in plain.tolist()]
    too_few = ModelSpec(path=two_input_model, name="two", class_names=["only"])
    engine = OnnxEngine(too_few)
    x = engine.example()(1)
    if plain[0] == 1:
        with pytest.raises(EngineError, match=r"outside 0\.\.0"):
            engine.infer(x)


def test_class_names_need_an_integer_label(two_input_model: Path) -> None:
    spec = ModelSpec(
        path=two_input_model,
        name="two",
        outputs={"p": "output_probability"},
        class_names=["a", "b"],
    )
    with pytest.raises(EngineError, match="class_names needs a result field 'label'"):
        OnnxEngine(spec)


# --- buckets, IOBinding, out-of-memory and provider fallback ----------------------------
# What a GPU serves with, run here by the CPU provider: the same code paths.


def _recording(engine: OnnxEngine) -> list[int]:
    """Rows of every batch that reaches ONNX Runtime through ``session.run``."""
    seen: list[int] = []
    real = engine._run

    def run(names: Any, feeds: Any) -> Any:
        seen.append(len(next(iter(feeds.values()))))
        return real(names, feeds)

    engine._run = run
    return seen


def _recording_bound(engine: OnnxEngine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows of every batch run through IOBinding, as its bound output holds them."""
    seen: list[int] = []
    session = engine._session
    real = session.run_with_iobinding

    def run(binding: Any, run_options: Any = None) -> None:
        real(binding, run_options)
        seen.append(binding.get_outputs()[0].shape()[0])

    monkeypatch.setattr(session, "run_with_iobinding", run)
    return seen


SIZES_100 = warm_up_sizes(100)


@pytest.mark.parametrize("io_binding", [False, True], ids=["padded", "padded+iobinding"])
def test_every_batch_size_reaches_the_model_only_at_bucket_sizes(
    make_spec: SpecFactory,
    classifier: DemoModel,
    monkeypatch: pytest.MonkeyPatch,
    io_binding: bool,
) -> None:
    plain = OnnxEngine(make_spec())
    padded = OnnxEngine(
        make_spec(pad_to_buckets=True, io_binding=io_binding), batch_sizes=SIZES_100
    )
    assert (padded.padded, padded.io_binding) == (True, io_binding)
    seen = _recording_bound(padded, monkeypatch) if io_binding else _recording(padded)
    x = np.tile(classifier.features, (2, 1))
    for rows in [*range(1, 101), 101, 250]:  # and larger than the largest: slices of it
        want = plain.infer(x[:rows])
        got = padded.infer(x[:rows])
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{rows} rows")
    assert set(seen) == set(SIZES_100)
    assert seen[-3:] == [100, 100, 64]  # 250 rows: 100 + 100 + 50 (at 64)


def test_string_and_zipmap_models_pad_too_but_are_not_bound(
    two_input_model: Path,
    exported: Callable[[str], tuple[Any, Data, OnnxEngine]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = ModelSpec(path=two_input_model, name="two", pad_to_buckets=True, io_binding=True)
    with caplog.at_level("INFO", logger="worker.inference.engine"):
        engine = OnnxEngine(spec, batch_sizes=[1, 2, 4, 8])
    assert "no IOBinding (input 'cat' is tensor(string))" in caplog.text
    assert engine.padded and not engine.io_binding
    seen = _recording(engine)
    cats = np.array([["FR", "vip"], ["DE", "smb"], ["FR", "smb"]] * 2, dtype=object)
    plain = OnnxEngine(ModelSpec(path=two_input_model, name="two"))
    for rows in range(1, 7):
        got, want = engine.infer({"cat": cats[:rows]}), plain.infer({"cat": cats[:rows]})
        np.testing.assert_array_equal(got["label"], want["label"])
        np.testing.assert_allclose(got["scores"], want["scores"], rtol=0, atol=0)
    assert set(seen) == {1, 2, 4, 8}
    model, (x, _y), zipmap = exported("multiclass-str")
    zipmap_padded = OnnxEngine(
        ModelSpec(path=zipmap._path, name="z", pad_to_buckets=True, io_binding=True),
        batch_sizes=[4, 16],
    )
    assert not zipmap_padded.io_binding  # its scores are a list of maps
    for rows in (1, 5, 16, 40):
        out = zipmap_padded.infer(x[:rows])
        np.testing.assert_allclose(out["scores"], model.predict_proba(x[:rows]), atol=1e-5)
    zipmap_padded.warm_up([4, 16])


def test_a_bound_engine_keeps_no_state_between_batches(
    make_spec: SpecFactory, classifier: DemoModel
) -> None:
    engine = OnnxEngine(make_spec(pad_to_buckets=True, io_binding=True), batch_sizes=[8])
    plain = OnnxEngine(make_spec())
    x = classifier.features
    first = engine.infer(x[:7])
    second = engine.infer(x[100:103])  # same bucket, fewer rows: row 0 pads the rest
    for got, rows in ((first, x[:7]), (second, x[100:103])):
        want = plain.infer(rows)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_warm_up_on_a_gpu_provider_runs_the_largest_size_first(
    make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = OnnxEngine(make_spec())
    seen = _recording(engine)
    engine.warm_up([1, 2, 4, 8])
    monkeypatch.setattr(engine, "provider", "CUDAExecutionProvider")
    engine.warm_up([1, 2, 4, 8])
    assert seen == [1, 2, 4, 8, 8, 1, 2, 4]


# ONNX Runtime's words for a failed arena allocation (microsoft/onnxruntime#22702).
ARENA_OOM = (
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while "
    "running MatMul node. Name:'MatMul' Status Message: /onnxruntime_src/onnxruntime/core/"
    "framework/bfc_arena.cc:376 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, "
    "bool, onnxruntime::Stream*, bool, onnxruntime::WaitNotificationFn) Failed to allocate "
    "memory for requested buffer of size 4194304"
)
CUDA_OOM = (
    "[ONNXRuntimeError] : 1 : FAIL : /onnxruntime_src/onnxruntime/core/providers/cuda/"
    "cuda_call.cc:114 onnxruntime::CudaCall CUDA failure 2: out of memory ; GPU=0"
)


def _oom_above(engine: OnnxEngine, limit: int, message: str) -> list[int]:
    """Make the engine's Runtime calls fail as a full device does, above ``limit`` rows;
    smaller batches run for real. Returns the rows of every call."""
    calls: list[int] = []
    real = engine._run

    def run(names: Any, feeds: Any) -> Any:
        rows = len(next(iter(feeds.values())))
        calls.append(rows)
        if rows > limit:
            raise onnxruntime.capi.onnxruntime_pybind11_state.RuntimeException(message)
        return real(names, feeds)

    engine._run = run
    return calls


@pytest.mark.parametrize("message", [ARENA_OOM, CUDA_OOM], ids=["arena", "cuda"])
def test_out_of_memory_halves_the_batch_and_counts_each_halving(
    make_spec: SpecFactory,
    classifier: DemoModel,
    caplog: pytest.LogCaptureFixture,
    message: str,
) -> None:
    from prometheus_client import CollectorRegistry

    from worker.compose import Metrics

    registry = CollectorRegistry()
    counter = Metrics(registry).device_oom_retries.labels("fraud")
    engine = OnnxEngine(make_spec(), on_device_oom=counter.inc)
    want = OnnxEngine(make_spec()).infer(classifier.features[:200])
    calls = _oom_above(engine, 60, message)
    with caplog.at_level("WARNING", logger="worker.inference.engine"):
        got = engine.infer(classifier.features[:200])
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    # 200 -> 100 + 100 -> 50 + 50 + 50 + 50: three halvings, four runs that fit
    assert calls == [200, 100, 50, 50, 100, 50, 50]
    assert (
        registry.get_sample_value("streamfer_device_oom_retries_total", {"pipeline": "fraud"}) == 3
    )
    assert caplog.text.count("out of device memory on 200 rows") == 1  # once per batch


def test_one_row_that_does_not_fit_is_an_engine_error(make_spec: SpecFactory) -> None:
    engine = OnnxEngine(make_spec())
    calls = _oom_above(engine, 0, ARENA_OOM)
    with pytest.raises(EngineError, match=r"model run failed on 1 rows: .*Failed to allocate"):
        engine.infer(np.zeros((4, 30), dtype=np.float32))
    assert calls == [4, 2, 1]  # the first half's last row fails, and with it the batch


def test_other_errors_are_not_halved(make_spec: SpecFactory) -> None:
    counted: list[int] = []
    engine = OnnxEngine(make_spec(), on_device_oom=lambda: counted.append(1))
    with pytest.raises(EngineError, match="model run failed on 8 rows"):
        engine.infer(np.zeros((8, 5), dtype=np.float32))  # wrong width
    assert counted == []


def test_a_real_arena_out_of_memory_is_halved(tmp_path: Path) -> None:
    """ONNX Runtime's own allocation failure, on the CPU: a session whose arena is capped
    at 6 MiB (a shared environment allocator) stands in for a full device. 1024 rows need
    16 MiB for the hidden layer, 256 rows fit."""
    hidden = 4096
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, hidden)).astype(np.float32)
    w2 = rng.standard_normal((hidden, 2)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["Y"]),
        ],
        "wide",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2])],
        initializer=[
            onnx.numpy_helper.from_array(w1, "w1"),
            onnx.numpy_helper.from_array(w2, "w2"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "wide.onnx"
    path.write_bytes(model.SerializeToString())
    info = onnxruntime.OrtMemoryInfo(
        "Cpu", onnxruntime.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, onnxruntime.OrtMemType.DEFAULT
    )
    try:
        onnxruntime.create_and_register_allocator(
            info, onnxruntime.OrtArenaCfg(6 * 1024 * 1024, 1, -1, -1)
        )
    except Exception as exc:  # registered once per process
        assert "already" in str(exc).lower()
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.use_env_allocators", "1")
    capped = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1024, 16)).astype(np.float32)
    with pytest.raises(Exception, match="BFCArena") as info_:
        capped.run(None, {"X": x})
    assert is_device_oom(info_.value)

    halvings: list[int] = []
    engine = OnnxEngine(ModelSpec(path=path, name="wide"), on_device_oom=lambda: halvings.append(1))
    engine._run = capped.run
    got = engine.infer(x)["Y"]
    np.testing.assert_allclose(
        got, OnnxEngine(ModelSpec(path=path, name="wide")).infer(x)["Y"], rtol=1e-5
    )
    assert 1 <= len(halvings) <= 3  # 1024 -> 512s -> 256s fit within the cap


def test_requested_cuda_on_the_cpu_build_falls_back_with_the_reason(
    make_spec: SpecFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="worker.inference.session"):
        engine = OnnxEngine(
            make_spec(
                providers=[
                    "TensorrtExecutionProvider",
                    "CUDAExecutionProvider",
                    "CPUExecutionProvider",
                ]
            )
        )
    assert engine.provider == "CPUExecutionProvider"
    assert engine.requested[0] == "TensorrtExecutionProvider"
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(lines) == 2, lines  # one each, in the order they were asked for
    assert lines[0].startswith("model m.onnx: TensorrtExecutionProvider does not serve: this is")
    assert lines[1].startswith("model m.onnx: CUDAExecutionProvider does not serve: this is")
    for line in lines:
        assert "CPU build of ONNX Runtime (onnxruntime " in line
    assert lines[0].endswith("; falling back to CUDAExecutionProvider")
    first, *remedy = lines[1].splitlines()
    assert first.endswith("; CPUExecutionProvider serves instead")
    # then, once, the pip commands that bring the GPU runtime (streamfer-gpu)
    assert any("pip install streamfer-gpu" in r for r in remedy), remedy
    assert not engine.padded and not engine.io_binding  # CPU serves: no padding by default


def test_a_gpu_provider_alone_that_cannot_serve_stops_start_up(make_spec: SpecFactory) -> None:
    with pytest.raises(EngineError, match="none of the execution providers") as info:
        OnnxEngine(make_spec(providers=["CUDAExecutionProvider"]))
    assert "CUDAExecutionProvider: this is the CPU build of ONNX Runtime" in str(info.value)


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_an_offered_provider_whose_library_is_missing_is_named(
    make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As on a GPU build whose CUDA libraries are missing: Runtime says it offers the
    provider, the session comes up without it, and the warning names the library."""
    offered = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: offered)
    with caplog.at_level("WARNING", logger="worker.inference.session"):
        engine = OnnxEngine(make_spec(providers=offered), batch_sizes=[1, 2, 4])
    assert engine.provider == "CPUExecutionProvider"
    assert "TensorrtExecutionProvider does not serve: its library " in caplog.text
    assert "libonnxruntime_providers_tensorrt.so is not in " in caplog.text
    assert "CUDAExecutionProvider does not serve: its library " in caplog.text


def test_the_device_oom_patterns_match_runtimes_words() -> None:
    for text in (
        ARENA_OOM,
        CUDA_OOM,
        "BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*) Available memory "
        "of 3380992 is smaller than requested bytes of 16777216",
        "CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED ; GPU=0",
        "CUDNN failure 4: CUDNN_STATUS_ALLOC_FAILED",
        "[TensorRT EP] Cuda Error in allocate: 2 (out of memory)",
        "cudaErrorMemoryAllocation: out of memory",
    ):
        assert is_device_oom(RuntimeError(text)), text
    assert not is_device_oom(RuntimeError("Got invalid dimensions for input: X"))


@pytest.mark.parametrize(
    "how",
    [{}, {"pad_to_buckets": True}, {"pad_to_buckets": True, "io_binding": True}],
    ids=["session.run", "padded", "bound"],
)
def test_an_engine_nothing_holds_is_freed_at_once(
    make_spec: SpecFactory, how: dict[str, bool]
) -> None:
    """No reference cycle (its runners reach it weakly): a model a reload replaced is
    freed as soon as the last batch that ran on it lets go, not at some later collection
    of old objects."""
    import gc
    import weakref

    engine = OnnxEngine(make_spec(**how), batch_sizes=[1, 2, 4])
    engine.warm_up([1, 2, 4])
    engine.infer(np.zeros((3, 30), dtype=np.float32))
    gone = weakref.ref(engine)
    gc.disable()
    try:
        del engine
        assert gone() is None
    finally:
        gc.enable()
