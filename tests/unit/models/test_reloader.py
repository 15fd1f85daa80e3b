"""Hot reload with real ONNX models: a new version is loaded, checked, warmed and swapped
in; a broken file, a model that does not fit the pipeline, a file that is not the pinned
one, a file still being written and a model another execution provider would serve are
not; the live model keeps serving throughout. A swap drops the output cache's rows of the
old model and the old model's provider series."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.fakes.clock import FakeClock
from tests.fakes.onnx_models import random_mlp
from tests.fakes.pipeline import one_pipeline
from worker.cache import OutputCache, open_cache
from worker.compose import Metrics
from worker.config import PipelineConfig, RedisSettings
from worker.inference.engine import file_sha256
from worker.inference.slot import LiveModel, ModelIdentity, ModelSlot
from worker.models.parts import load_model
from worker.models.reloader import Look, ModelWatch, Reloader, show_model

SETTLE_S = 1.0


@dataclass
class Served:
    """A pipeline's slot and the watch on its model, as the worker builds them."""

    config: PipelineConfig
    slot: ModelSlot
    watch: ModelWatch
    metrics: Metrics
    clock: FakeClock
    cache: OutputCache | None = None
    shas: dict[str, str] = field(default_factory=dict)

    @property
    def version(self) -> str:
        return self.slot.for_batch().identity.version

    def reloads(self, result: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "streamfer_model_reloads_total", {"pipeline": "p", "result": result}
        )
        return value or 0.0

    def series(self, family: str, *labels: str) -> list[tuple[str, ...]]:
        """``labels`` of every series of ``family``."""
        return [
            tuple(s.labels[name] for name in labels)
            for f in self.metrics.registry.collect()
            if f.name == family
            for s in f.samples
        ]

    def info(self) -> list[tuple[str, ...]]:
        """(version, sha256) of every streamfer_model_info series."""
        return self.series("streamfer_model_info", "version", "sha256")

    def providers(self) -> list[tuple[str, ...]]:
        """(provider, requested) of every streamfer_inference_provider series."""
        return self.series("streamfer_inference_provider", "provider", "requested")


def _model(path: Path, seed: int, **kw: Any) -> Path:
    random_mlp(path, seed=seed, **kw)
    return path


def _age(path: Path, seconds: float = 60.0) -> None:
    """Make ``path`` look written ``seconds`` ago: settled."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def _serve(
    model: dict[str, Any],
    *,
    settle_s: float = SETTLE_S,
    clock: Callable[[], float] | None = None,
    served_on: str | None = None,
    cache: dict[str, Any] | None = None,
) -> Served:
    """What ``build_worker`` builds for one pipeline. ``served_on`` names the provider
    the live engine says it serves on (this machine has only the CPU: a real engine
    loaded here, whose ``provider`` is set as a GPU host's would read)."""
    config = one_pipeline(model, cache)
    metrics = Metrics(CollectorRegistry())
    loaded = load_model(config, config.model)
    if served_on is not None:
        loaded.engine.provider = served_on
    metrics.inference_provider.labels("p", loaded.engine.provider, config.model.providers[0]).set(
        1
    )  # as open_parts does
    slot = ModelSlot(LiveModel.of(config.model, loaded.engine))
    identity = slot.for_batch().identity
    shown = show_model(metrics, "p", identity, loaded.engine.providers[0], hide=None)
    built = open_cache(config, RedisSettings(), metrics, loaded.engine)
    fake = FakeClock(1000.0)
    watch = ModelWatch(
        config,
        slot,
        loaded,
        metrics,
        shown=shown,
        settle_s=settle_s,
        clock=clock or fake,
        on_swap=built.serve if built is not None else None,
    )
    return Served(config, slot, watch, metrics, fake, built)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A directory of versions holding version 1, written a minute ago."""
    models = tmp_path / "models" / "fraud"
    _age(_model(models / "1" / "model.onnx", seed=1))
    return models


def test_a_new_version_is_loaded_warmed_and_swapped_in(root: Path) -> None:
    served = _serve({"path": str(root)})
    assert served.version == "1"
    assert served.watch.look() is Look.IDLE  # what serves is seen as such, not reloaded
    assert served.reloads("loaded") == served.reloads("refused") == 0
    v2 = _model(root / "2" / "model.onnx", seed=2)
    _age(v2)
    assert served.watch.look() is Look.LOADED
    assert served.version == "2"
    live = served.slot.for_batch()
    assert live.identity == ModelIdentity("m", "2", file_sha256(v2))
    assert live.engine.model_hash == file_sha256(v2)
    assert served.info() == [("2", file_sha256(v2))]  # the old series is gone
    assert served.reloads("loaded") == 1
    assert served.watch.look() is Look.IDLE


def test_a_broken_file_is_refused_once_and_the_live_version_keeps_serving(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served = _serve({"path": str(root)})
    broken = root / "2" / "model.onnx"
    broken.parent.mkdir()
    broken.write_bytes(b"\x08\x07 these are not the bytes of an ONNX model" * 100)
    _age(broken)
    with caplog.at_level(logging.ERROR, logger="worker.models.reloader"):
        assert served.watch.look() is Look.REFUSED
    assert served.version == "1"
    assert served.reloads("refused") == 1 and served.reloads("loaded") == 0
    (line,) = [r.getMessage() for r in caplog.records]
    assert "version 2" in line and str(broken) in line and "version 1 keeps serving" in line
    assert "cannot load model" in line
    # not tried again while it stays as it is; a fixed file is
    assert served.watch.look() is Look.IDLE
    assert served.reloads("refused") == 1
    _model(broken, seed=2)
    _age(broken)
    assert served.watch.look() is Look.LOADED
    assert served.version == "2"


def test_a_newer_good_version_after_a_refused_one_is_served(root: Path) -> None:
    served = _serve({"path": str(root)})
    (root / "2").mkdir()
    (root / "2" / "model.onnx").write_bytes(b"garbage")
    _age(root / "2" / "model.onnx")
    assert served.watch.look() is Look.REFUSED
    _age(_model(root / "3" / "model.onnx", seed=3))
    assert served.watch.look() is Look.LOADED
    assert served.version == "3"


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: _model(p, seed=2, n_in=4), "takes 4 columns but 3 features feed it"),
        (
            lambda p: _model(p, seed=2, softmax=False),
            "its results would be value (number[1]); the live model's are probabilities "
            "(number[2])",
        ),
    ],
    ids=["four-inputs", "other-outputs"],
)
def test_a_version_that_does_not_fit_the_pipeline_is_refused(
    root: Path, make: Callable[[Path], Path], says: str, caplog: pytest.LogCaptureFixture
) -> None:
    served = _serve({"path": str(root)})
    _age(make(root / "2" / "model.onnx"))
    with caplog.at_level(logging.ERROR, logger="worker.models.reloader"):
        assert served.watch.look() is Look.REFUSED
    assert served.version == "1" and served.reloads("refused") == 1
    assert says in caplog.records[0].getMessage()


def test_a_model_whose_inputs_are_typed_otherwise_is_refused(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Batches enriched for the live model may run on the new one, so the same width is
    not enough: a double input would be fed float32 arrays."""
    import onnx
    from onnx import TensorProto, helper

    served = _serve({"path": str(root)})
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["input"], ["s"], axes=[1], keepdims=1),
            helper.make_node("Concat", ["s", "s"], ["probabilities"], axis=1),
        ],
        "g",
        [helper.make_tensor_value_info("input", TensorProto.DOUBLE, ["n", 3])],
        [helper.make_tensor_value_info("probabilities", TensorProto.DOUBLE, ["n", 2])],
    )
    path = root / "2" / "model.onnx"
    path.parent.mkdir()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    onnx.checker.check_model(model)
    _age(path)
    with caplog.at_level(logging.ERROR, logger="worker.models.reloader"):
        assert served.watch.look() is Look.REFUSED
    assert served.version == "1"
    assert "inputs are not fed like the live model's" in caplog.records[0].getMessage()
    assert "input tensor(double)[batch, 3]" in caplog.records[0].getMessage()


def test_a_pinned_sha256_refuses_a_changed_file(tmp_path: Path) -> None:
    path = _model(tmp_path / "fraud.onnx", seed=1)
    _age(path)
    served = _serve({"path": str(path), "watch": True, "sha256": file_sha256(path)})
    assert served.watch.look() is Look.IDLE
    replacement = _model(tmp_path / "next.onnx", seed=2)
    os.replace(replacement, path)  # as a deployment replaces it: a rename
    _age(path)
    assert served.watch.look() is Look.REFUSED
    assert served.slot.for_batch().identity.sha256 != file_sha256(path)
    assert served.reloads("refused") == 1


def test_a_changed_plain_file_keeps_its_version_and_names_its_new_sha256(tmp_path: Path) -> None:
    path = _model(tmp_path / "fraud.onnx", seed=1)
    _age(path)
    served = _serve({"path": str(path), "version": "7"})
    new = _model(tmp_path / "next.onnx", seed=2)
    os.replace(new, path)
    _age(path)
    assert served.watch.look() is Look.LOADED
    assert served.slot.for_batch().identity == ModelIdentity("m", "7", file_sha256(path))


def test_the_same_bytes_written_again_are_not_reloaded(tmp_path: Path) -> None:
    path = _model(tmp_path / "fraud.onnx", seed=1)
    served = _serve({"path": str(path), "watch": True})
    before = served.slot.for_batch()
    copy = tmp_path / "copy.onnx"
    shutil.copyfile(path, copy)
    os.replace(copy, path)  # a new inode and mtime, the same content
    _age(path)
    assert served.watch.look() is Look.IDLE
    assert served.slot.for_batch() is before
    assert served.reloads("loaded") == served.reloads("refused") == 0


def test_a_file_still_being_written_is_not_loaded(root: Path) -> None:
    served = _serve({"path": str(root)})
    whole = _model(root.parent / "staging.onnx", seed=2).read_bytes()
    path = root / "2" / "model.onnx"
    path.parent.mkdir()
    path.write_bytes(whole[: len(whole) // 2])  # written just now, half of it
    assert served.watch.look() is Look.SETTLING
    served.clock.now += SETTLE_S / 2
    assert served.watch.look() is Look.SETTLING
    with path.open("ab") as fh:  # the writer goes on: it changed, so the wait starts again
        fh.write(whole[len(whole) // 2 :])
    served.clock.now += SETTLE_S / 2
    assert served.watch.look() is Look.SETTLING
    assert served.version == "1" and served.reloads("refused") == 0
    served.clock.now += SETTLE_S  # unchanged for the settle time: complete
    assert served.watch.look() is Look.LOADED
    assert served.version == "2" and served.reloads("refused") == 0


def test_removing_the_newest_version_goes_back_to_the_one_below(root: Path) -> None:
    served = _serve({"path": str(root)})
    _age(_model(root / "2" / "model.onnx", seed=2))
    assert served.watch.look() is Look.LOADED
    shutil.rmtree(root / "2")
    assert served.watch.look() is Look.LOADED
    assert served.version == "1"


def test_an_emptied_directory_leaves_the_live_version_serving(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served = _serve({"path": str(root)})
    shutil.rmtree(root / "1")
    with caplog.at_level(logging.WARNING, logger="worker.models.reloader"):
        assert served.watch.look() is Look.IDLE
        assert served.watch.look() is Look.IDLE
    assert served.version == "1"
    assert [r.getMessage() for r in caplog.records] == [
        f"pipeline p: no model at {root} now; the live one keeps serving"
    ]


def test_a_pinned_version_of_a_directory_does_not_follow_newer_ones(root: Path) -> None:
    _age(_model(root / "2" / "model.onnx", seed=2))
    served = _serve({"path": str(root), "version": "1"})
    _age(_model(root / "3" / "model.onnx", seed=3))
    assert served.watch.polls  # a directory is watched: here, version 1's file
    assert served.watch.look() is Look.IDLE
    assert served.version == "1"


def test_the_reloader_polls_watched_models_on_its_thread(root: Path) -> None:
    served = _serve({"path": str(root), "reload_poll_s": 0.05})
    reloader = Reloader([served.watch], settle_s=SETTLE_S)
    reloader.start()
    try:
        _age(_model(root / "2" / "model.onnx", seed=2))
        deadline = time.monotonic() + 20
        while served.version != "2" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert served.version == "2"
    finally:
        assert reloader.stop(5.0)


def test_a_request_makes_an_unwatched_model_be_looked_at(tmp_path: Path) -> None:
    path = _model(tmp_path / "fraud.onnx", seed=1)
    _age(path)
    served = _serve({"path": str(path)})
    assert not served.watch.polls
    requests = threading.Event()
    reloader = Reloader([served.watch], requests=requests, settle_s=0.05)
    reloader.start()
    try:
        os.replace(_model(tmp_path / "next.onnx", seed=2), path)
        _age(path)
        time.sleep(0.3)
        assert served.slot.for_batch().identity.sha256 != file_sha256(path)  # not polled
        requests.set()  # what SIGHUP's handler does
        deadline = time.monotonic() + 20
        while served.reloads("loaded") < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert served.slot.for_batch().identity.sha256 == file_sha256(path)
    finally:
        assert reloader.stop(5.0)


def test_a_request_waits_for_a_file_that_is_settling(tmp_path: Path) -> None:
    """A SIGHUP right after a copy: the check waits until the file has stopped changing."""
    path = _model(tmp_path / "fraud.onnx", seed=1)
    _age(path)
    served = _serve({"path": str(path)}, settle_s=0.2, clock=time.monotonic)
    os.replace(_model(tmp_path / "next.onnx", seed=2), path)  # written just now
    assert Reloader([served.watch], settle_s=0.2).check_now() == {"p": Look.LOADED}
    assert served.slot.for_batch().identity.sha256 == file_sha256(path)


# --- the execution provider -------------------------------------------------------------

GPU_FIRST = ["CUDAExecutionProvider", "CPUExecutionProvider"]
"""Requested as on a GPU host; here CUDA is not available, so a model loaded for real
falls back to the CPU, as it would on a GPU host whose CUDA libraries broke."""


def test_a_version_another_provider_would_serve_is_refused_and_the_live_one_serves(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served = _serve({"path": str(root), "providers": GPU_FIRST}, served_on="CUDAExecutionProvider")
    live = served.slot.for_batch()
    _age(_model(root / "2" / "model.onnx", seed=2))
    with caplog.at_level(logging.ERROR, logger="worker.models.reloader"):
        assert served.watch.look() is Look.REFUSED
    assert served.slot.for_batch() is live and served.version == "1"
    assert served.reloads("refused") == 1 and served.reloads("loaded") == 0
    (line,) = [r.getMessage() for r in caplog.records if r.name == "worker.models.reloader"]
    assert (
        "model version 2 at" in line
        and "refused (it would be served by CPUExecutionProvider, the live model by "
        "CUDAExecutionProvider; set model.allow_provider_change = true to allow that)"
        in line
        and "version 1 keeps serving" in line
    )
    assert served.providers() == [("CUDAExecutionProvider", "CUDAExecutionProvider")]
    assert served.watch.look() is Look.IDLE  # not tried again until the file changes


def test_a_provider_change_is_served_when_allowed_and_the_old_series_goes(root: Path) -> None:
    model = {"path": str(root), "providers": GPU_FIRST, "allow_provider_change": True}
    served = _serve(model, served_on="CUDAExecutionProvider")
    assert served.providers() == [("CUDAExecutionProvider", "CUDAExecutionProvider")]
    _age(_model(root / "2" / "model.onnx", seed=2))
    assert served.watch.look() is Look.LOADED
    assert served.version == "2" and served.reloads("loaded") == 1
    assert served.providers() == [("CPUExecutionProvider", "CUDAExecutionProvider")]


def test_a_reload_on_the_same_provider_keeps_one_provider_series(root: Path) -> None:
    served = _serve({"path": str(root), "providers": GPU_FIRST})
    for version in ("2", "3"):
        _age(_model(root / version / "model.onnx", seed=int(version)))
        assert served.watch.look() is Look.LOADED
    assert served.version == "3"
    assert served.providers() == [("CPUExecutionProvider", "CUDAExecutionProvider")]


# --- the output cache --------------------------------------------------------------------


def test_a_swap_drops_the_old_models_cached_rows_and_a_refusal_keeps_them(root: Path) -> None:
    served = _serve({"path": str(root)}, cache={"enabled": True})
    cache = served.cache
    assert cache is not None
    old = served.slot.for_batch().engine
    rows = [(bytes([i]) * 16, b'{"probabilities":[0.5,0.5]}') for i in range(5)]
    cache.memory.put_many(rows, cache.namespace_of(old))
    assert len(cache.memory) == 5

    broken = root / "2" / "model.onnx"
    broken.parent.mkdir()
    broken.write_bytes(b"not a model")
    _age(broken)
    assert served.watch.look() is Look.REFUSED
    assert len(cache.memory) == 5  # the live model's rows stay

    _age(_model(root / "3" / "model.onnx", seed=3))
    assert served.watch.look() is Look.LOADED
    assert len(cache.memory) == 0 and cache.memory.nbytes == 0
    gauge = served.metrics.registry.get_sample_value
    assert gauge("streamfer_cache_entries", {"pipeline": "p"}) == 0
    assert gauge("streamfer_cache_bytes", {"pipeline": "p"}) == 0
    # a batch that ran on the old model and settles now keeps nothing
    cache.memory.put_many(rows, cache.namespace_of(old))
    assert len(cache.memory) == 0
    new = served.slot.for_batch().engine
    cache.memory.put_many(rows, cache.namespace_of(new))
    assert len(cache.memory) == 5
