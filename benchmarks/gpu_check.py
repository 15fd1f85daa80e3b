"""The device check (``bash benchmarks/gpu_check.sh``): the heavy model on the CPU and on
the GPU, ONNX Runtime alone and the worker's own inference stage, with ratios.

The model is the heavy benchmark model (``benchmarks.models.make_model("heavy")``: the
MLP 1024-1024-1024-512 that skl2onnx exports; ``benchmarks/gpu_prepare.sh`` writes it and
its FP16 copy, made with the model tools' converter, to ``.gpu/`` for a machine that can make
neither). At batch 256 it times:

- ONNX Runtime alone (``session.run``): CPU with one thread (the worker's default) and
  with every core; CUDA FP32; CUDA FP16 (the FP16 model); TensorRT FP16;
- the worker's inference stage, ``OnnxEngine.infer``, at the same settings (on a GPU it
  pads to the warmed buckets and binds its buffers, by default);
- PyTorch on the GPU with the same weights, read from the ONNX file, FP32 and FP16, from
  host arrays to host arrays and on the device alone: the device's ceiling for this model.

A row whose provider cannot serve is skipped with the reason ``worker.inference.providers`` gives
(the CPU build of ONNX Runtime; a CUDA or TensorRT library that does not load). Each row
gives rows/s (256 over the median call), the median and p99 of one batch in ms, its
largest score difference from ORT CPU, and its speed over ORT CPU's. A second table runs
ragged batch sizes (1..256) through the worker's stage with and without padding, which
is what decides whether padding pays on that provider. ``--json FILE`` writes every
figure. Without a GPU it runs the CPU rows, and says which rows it skipped and why.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["WHEEL_SIZES", "main"]

BATCH = 256
RAGGED_BATCHES = 60
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"

WHEEL_SIZES = {
    "onnxruntime-gpu 1.31.1 cp312 manylinux_2_28_x86_64 (CUDA 13, cuDNN 9)": 255_569_273,
    "onnxruntime-gpu 1.23.2 cp311 manylinux x86_64": 300_525_715,
}
"""Bytes, read with ``pip download --no-deps`` on 2026-12-01: more than one device call
carries, so ``benchmarks/gpu_prepare.sh`` cuts the first into pieces (``benchmarks.pieces``).
TensorRT's libraries (``tensorrt-cu12/13-libs``) have no wheel on PyPI (checked with
``pip download --only-binary=:all:`` on 2026-12-03), only on NVIDIA's index, which could
not be reached from here; they are larger still."""
CARRY_LIMIT = 64 * 1024 * 1024
"""What one run may carry to the device machine, the repository included."""

Array = npt.NDArray[Any]


@dataclass
class Row:
    name: str
    rps: float
    p50_ms: float
    p99_ms: float
    max_diff: float | None = None
    note: str = ""


@dataclass
class Report:
    environment: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    ragged: list[Row] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _timed(fn: Callable[[], Any], budget_s: float, max_calls: int = 2000) -> list[float]:
    """Milliseconds per call: three warm calls, then at least 20 calls and as many more
    as ``budget_s`` holds."""
    for _ in range(3):
        fn()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < 20 or (time.perf_counter() - started < budget_s and len(times) < max_calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return times


def _row(name: str, times: Sequence[float], rows: int, diff: float | None, note: str = "") -> Row:
    p50 = _percentile(times, 50)
    return Row(name, rows / (p50 / 1000.0), p50, _percentile(times, 99), diff, note)


def _scores(out: Any) -> Array:
    """The probabilities of one run: the output named so, or the last float matrix."""
    if isinstance(out, dict):
        return np.asarray(out.get("scores", out.get("probabilities")), dtype=np.float64)
    return np.asarray(out[-1], dtype=np.float64)


def _features() -> Array:
    try:
        from sklearn.datasets import load_breast_cancer

        x: Array = load_breast_cancer().data.astype(np.float32)
    except ImportError:  # the rows' values do not change the cost of this model
        x = np.random.default_rng(0).standard_normal((569, 30)).astype(np.float32) * 100
    return x


# --- the models -------------------------------------------------------------------------


def _models(model: Path | None, fp16: Path | None, report: Report) -> tuple[Path, Path | None]:
    """The heavy model and its FP16 copy: as given, or made here (needs the demo extra
    which the device machine lacks: carry ``.gpu/``)."""
    if model is not None and model.is_file():
        return model, fp16 if fp16 is not None and fp16.is_file() else None
    folder = Path(tempfile.mkdtemp(prefix="streamfer-gpu-check-"))
    try:
        from benchmarks.models import make_model

        made = make_model("heavy", folder).path
    except ImportError as exc:
        raise SystemExit(
            f"gpu_check: no model at {model} and it cannot be made here ({exc}): run "
            "bash benchmarks/gpu_prepare.sh where the dev extra is installed and carry .gpu"
        ) from None
    report.notes.append(f"model made here: {made}")
    return made, make_fp16(made, folder / "heavy-fp16.onnx", report)


def make_fp16(model: Path, out: Path, report: Report | None = None) -> Path | None:
    """The model with float16 weights and float32 inputs and outputs, made by
    ``streamfer model optimize --fp16``'s converter (ONNX Runtime's own, which needs onnx)."""
    try:
        import onnx

        from worker.tools import convert_fp16
    except ImportError as exc:
        if report is not None:
            report.skipped.append(("FP16 model", f"cannot convert here: {exc}"))
        return None
    convert_fp16(onnx.load(str(model)), out, model)
    return out


# --- ONNX Runtime alone -----------------------------------------------------------------


def _ort_session(path: Path, providers: list[Any], threads: int = 1) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=providers)


def _why_not(provider: str) -> str:
    """Why ``provider`` cannot serve here, as the worker would say it."""
    try:
        import onnxruntime as ort

        from worker.inference import why_not_serving

        return why_not_serving(provider, ort.get_available_providers())
    except ImportError as exc:
        return f"(the worker's explanation needs {exc.name})"


def _gpu_session(path: Path, providers: list[Any], wanted: str) -> tuple[Any, str | None]:
    """A session whose first provider is ``wanted``, or None and why not."""
    import onnxruntime as ort

    if wanted not in ort.get_available_providers():
        return None, f"{wanted}: {_why_not(wanted)}"
    try:
        session = _ort_session(path, providers)
    except Exception as exc:
        return None, f"{wanted}: the session failed: {exc}"
    if session.get_providers()[0] != wanted:
        return None, f"{wanted}: {_why_not(wanted)}"
    return session, None


def _trt_options(path: Path, cache: Path, fp16: bool = True) -> list[Any]:
    from worker.config import ModelSpec, TensorrtOptions
    from worker.inference import input_shapes, provider_options, warm_up_sizes

    spec = ModelSpec(
        path=path,
        name="heavy",
        providers=[TENSORRT, CUDA, CPU],
        tensorrt=TensorrtOptions(fp16=fp16, engine_cache_dir=cache, timing_cache_dir=cache),
    )
    return provider_options(
        spec,
        [TENSORRT, CUDA, CPU],
        batch_sizes=warm_up_sizes(BATCH),
        inputs=input_shapes(path),
    )


def ort_rows(report: Report, model: Path, fp16: Path | None, x: Array, budget_s: float) -> Array:
    """Time ONNX Runtime alone; returns ORT CPU's scores, the reference."""
    import onnxruntime as ort

    name = _ort_session(model, [CPU]).get_inputs()[0].name
    feeds = {name: x}
    cpu1 = _ort_session(model, [CPU], threads=1)
    ref = _scores(cpu1.run(None, feeds))
    report.rows.append(
        _row("ORT CPU, 1 thread", _timed(lambda: cpu1.run(None, feeds), budget_s), BATCH, 0.0)
    )
    cores = os.cpu_count() or 1
    cpun = _ort_session(model, [CPU], threads=0)
    report.rows.append(
        _row(
            f"ORT CPU, all {cores} cores",
            _timed(lambda: cpun.run(None, feeds), budget_s),
            BATCH,
            float(np.abs(_scores(cpun.run(None, feeds)) - ref).max()),
        )
    )
    gpu: list[tuple[str, Path | None, list[Any], str]] = [
        ("ORT CUDA FP32", model, [CUDA, CPU], CUDA),
        ("ORT CUDA FP16", fp16, [CUDA, CPU], CUDA),
    ]
    for label, path, providers, wanted in gpu:
        if path is None:
            report.skipped.append((label, "no FP16 model (carry .gpu/heavy-fp16.onnx)"))
            continue
        session, why = _gpu_session(path, providers, wanted)
        if session is None:
            report.skipped.append((label, str(why)))
            continue
        diff = float(np.abs(_scores(session.run(None, feeds)) - ref).max())
        report.rows.append(
            _row(label, _timed(lambda s=session: s.run(None, feeds), budget_s), BATCH, diff)
        )
    if TENSORRT not in ort.get_available_providers():
        report.skipped.append(("ORT TensorRT FP16", f"{TENSORRT}: {_why_not(TENSORRT)}"))
        return ref
    with tempfile.TemporaryDirectory(prefix="streamfer-trt-") as cache:
        started = time.perf_counter()
        session, why = _gpu_session(model, _trt_options(model, Path(cache)), TENSORRT)
        if session is None:
            report.skipped.append(("ORT TensorRT FP16", str(why)))
            return ref
        first = session.run(None, feeds)
        built = time.perf_counter() - started
        diff = float(np.abs(_scores(first) - ref).max())
        report.rows.append(
            _row(
                "ORT TensorRT FP16",
                _timed(lambda: session.run(None, feeds), budget_s),
                BATCH,
                diff,
                f"engine built in {built:.1f} s",
            )
        )
    return ref


# --- the worker's inference stage -------------------------------------------------------


def _engine(path: Path, providers: list[str], cache: Path | None = None, **model: Any) -> Any:
    from worker.config import ModelSpec, TensorrtOptions
    from worker.inference import OnnxEngine, warm_up_sizes

    trt = TensorrtOptions(fp16=True, engine_cache_dir=cache, timing_cache_dir=cache)
    spec = ModelSpec(path=path, name="heavy", providers=providers, tensorrt=trt, **model)  # type: ignore[arg-type]
    engine = OnnxEngine(spec, batch_sizes=warm_up_sizes(BATCH))
    engine.warm_up(warm_up_sizes(BATCH))
    return engine


def engine_rows(
    report: Report, model: Path, fp16: Path | None, x: Array, ref: Array, budget_s: float
) -> None:
    """Time ``OnnxEngine.infer`` at batch 256 and over ragged sizes, per setting."""
    try:
        import onnxruntime as ort

        from worker.inference import OnnxEngine  # noqa: F401  (needs pydantic and orjson)
    except ImportError as exc:
        why = (
            f"worker.inference does not import: {exc} (carry .whl: bash benchmarks/gpu_prepare.sh)"
        )
        report.skipped.append(("streamfer OnnxEngine.infer rows", why))
        return
    available = ort.get_available_providers()
    padded: dict[str, Any] = {"pad_to_buckets": True}
    bound: dict[str, Any] = {"pad_to_buckets": True, "io_binding": True}
    settings: list[tuple[str, Path | None, list[str], dict[str, Any]]] = [
        ("streamfer CPU (default: 1 thread, unpadded)", model, [CPU], {}),
        ("streamfer CPU, padded", model, [CPU], padded),
        ("streamfer CPU, padded + IOBinding", model, [CPU], bound),
        ("streamfer CUDA FP32 (default: padded + IOBinding)", model, [CUDA, CPU], {}),
        ("streamfer CUDA FP32, padded, no IOBinding", model, [CUDA, CPU], {"io_binding": False}),
        ("streamfer CUDA FP32, unpadded", model, [CUDA, CPU], {"pad_to_buckets": False}),
        ("streamfer CUDA FP16 (default)", fp16, [CUDA, CPU], {}),
        ("streamfer TensorRT FP16 (default)", model, [TENSORRT, CUDA, CPU], {}),
    ]
    with tempfile.TemporaryDirectory(prefix="streamfer-trt-engine-") as cache:
        for label, path, providers, options in settings:
            wanted = providers[0]
            if path is None:
                report.skipped.append((label, "no FP16 model (carry .gpu/heavy-fp16.onnx)"))
                continue
            if wanted not in available:
                report.skipped.append((label, f"{wanted}: {_why_not(wanted)}"))
                continue
            started = time.perf_counter()
            engine = _engine(path, providers, Path(cache), **options)
            ready = time.perf_counter() - started
            if engine.provider != wanted:
                report.skipped.append((label, f"{wanted}: {_why_not(wanted)}"))
                continue
            diff = float(np.abs(_scores(engine.infer(x)) - ref).max())
            times = _timed(lambda e=engine: e.infer(x), budget_s)
            note = f"{engine.io_path}; ready (load + warm-up) in {ready:.1f} s"
            report.rows.append(_row(label, times, BATCH, diff, note))
            ragged_row(report, label, engine, x)


def ragged_row(report: Report, label: str, engine: Any, x: Array) -> None:
    """Rows/s over the same ragged sequence of batch sizes (1..256), twice through."""
    sizes = np.random.default_rng(7).integers(1, BATCH + 1, RAGGED_BATCHES).tolist()
    pool = np.resize(x, (BATCH, x.shape[1]))
    for size in sizes[:5]:
        engine.infer(pool[:size])
    times: list[float] = []
    rows = 0
    for _ in range(2):
        for size in sizes:
            t0 = time.perf_counter()
            engine.infer(pool[:size])
            times.append((time.perf_counter() - t0) * 1000.0)
            rows += size
    total_s = sum(times) / 1000.0
    report.ragged.append(
        Row(label, rows / total_s, _percentile(times, 50), _percentile(times, 99), None, "")
    )


# --- PyTorch with the same weights: the device's ceiling ---------------------------------


def mlp_weights(path: Path) -> dict[str, Any]:
    """skl2onnx's MLPClassifier graph read back: the Scaler's offset and scale, then each
    MatMul's weights with the Add's bias that follows it, in order."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    init = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    scaler = next(n for n in graph.node if n.op_type == "Scaler")
    attrs = {a.name: list(onnx.helper.get_attribute_value(a)) for a in scaler.attribute}
    layers = []
    for node in graph.node:
        if node.op_type == "MatMul":
            layers.append([init[node.input[1]].astype(np.float32), None])
        elif node.op_type == "Add" and layers and layers[-1][1] is None:
            layers[-1][1] = init[node.input[1]].astype(np.float32)
    return {
        "offset": np.asarray(attrs["offset"], dtype=np.float32),
        "scale": np.asarray(attrs["scale"], dtype=np.float32),
        "layers": layers,
    }


def mlp_forward(weights: dict[str, Any], x: Array) -> Array:
    """The graph's probabilities in numpy float64, as the PyTorch rows compute them:
    ``(x - offset) * scale``, ReLU layers, a sigmoid, then ``[1 - p, p]``."""
    h = (x.astype(np.float64) - weights["offset"]) * weights["scale"]
    *hidden, (w_out, b_out) = weights["layers"]
    for w, b in hidden:
        h = np.maximum(h @ w + b, 0.0)
    p = 1.0 / (1.0 + np.exp(-(h @ w_out + b_out)))
    out: Array = np.concatenate([1.0 - p, p], axis=1)
    return out


def torch_rows(report: Report, model: Path, x: Array, ref: Array, budget_s: float) -> None:
    try:
        import torch
    except ImportError as exc:
        report.skipped.append(("PyTorch CUDA rows", f"torch does not import: {exc}"))
        return
    if not torch.cuda.is_available():
        report.skipped.append(
            ("PyTorch CUDA rows", f"torch {torch.__version__} sees no CUDA device")
        )
        return
    report.environment["gpu"] = torch.cuda.get_device_name(0)
    weights = mlp_weights(model)
    dev = torch.device("cuda")
    for dtype, label in ((torch.float32, "FP32"), (torch.float16, "FP16")):
        off = torch.from_numpy(weights["offset"]).to(dev)
        scale = torch.from_numpy(weights["scale"]).to(dev)
        layers = [
            (torch.from_numpy(w).to(dev, dtype), torch.from_numpy(b).to(dev, dtype))
            for w, b in weights["layers"]
        ]

        def forward(
            t: Any, layers: Any = layers, off: Any = off, scale: Any = scale, dtype: Any = dtype
        ) -> Any:
            h = ((t - off) * scale).to(dtype)
            for w, b in layers[:-1]:
                h = torch.relu(h @ w + b)
            w, b = layers[-1]
            p = torch.sigmoid(h @ w + b).float()
            return torch.cat([1 - p, p], dim=1)

        host = torch.from_numpy(x).pin_memory()

        def host_to_host(host: Any = host, forward: Any = forward) -> Any:
            with torch.inference_mode():
                return forward(host.to(dev, non_blocking=True)).cpu().numpy()

        on_device = host.to(dev)

        def device_only(on_device: Any = on_device, forward: Any = forward) -> Any:
            with torch.inference_mode():
                out = forward(on_device)
            torch.cuda.synchronize()
            return out

        diff = float(np.abs(host_to_host().astype(np.float64) - ref).max())
        report.rows.append(
            _row(
                f"PyTorch CUDA {label}, host in and out (pinned)",
                _timed(host_to_host, budget_s),
                BATCH,
                diff,
            )
        )
        report.rows.append(
            _row(
                f"PyTorch CUDA {label}, on the device only",
                _timed(device_only, budget_s),
                BATCH,
                diff,
            )
        )


# --- report -----------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    import onnxruntime as ort

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "onnxruntime": ort.__version__,
        "available_providers": ort.get_available_providers(),
        "cpus": os.cpu_count(),
    }
    for dist in ("onnxruntime-gpu", "tensorrt", "torch", "pydantic", "orjson"):
        try:
            env[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            env[dist] = None
    return env


def render(report: Report) -> str:
    base = next((r.rps for r in report.rows if r.name == "ORT CPU, 1 thread"), None)
    raw = {r.name: r.rps for r in report.rows if r.name.startswith("ORT ")}
    lines = [
        f"streamfer device check: heavy model (MLP 1024-1024-1024-512), batch {BATCH}",
        "environment: " + ", ".join(f"{k} {v}" for k, v in report.environment.items()),
        "",
        f"{'row':<52} {'rows/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'max|diff|':>10} "
        f"{'x ORT CPU':>9} {'x ORT same':>10}  note",
        "-" * 120,
    ]
    for r in report.rows:
        same = _same_setting(r.name, raw)
        lines.append(
            f"{r.name:<52} {r.rps:>10,.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} "
            f"{'-' if r.max_diff is None else f'{r.max_diff:.1e}':>10} "
            f"{(r.rps / base) if base else float('nan'):>9.2f} "
            f"{(r.rps / same) if same else float('nan'):>10.2f}  {r.note}"
        )
    if report.ragged:
        lines += [
            "",
            f"ragged batches: {RAGGED_BATCHES} sizes drawn from 1..{BATCH}, run twice",
            f"{'row':<52} {'rows/s':>10} {'p50 ms':>8} {'p99 ms':>8}",
        ]
        lines += [
            f"{r.name:<52} {r.rps:>10,.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f}" for r in report.ragged
        ]
    if report.skipped:
        lines += ["", "skipped:"]
        lines += [f"  {name}: {why}" for name, why in report.skipped]
    lines += [""] + [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def _same_setting(name: str, raw: dict[str, float]) -> float | None:
    """ORT alone at the worker row's setting (x ORT same: the stage's own overhead)."""
    pairs = {
        "streamfer CPU (default": "ORT CPU, 1 thread",
        "streamfer CPU, padded": "ORT CPU, 1 thread",
        "streamfer CUDA FP32": "ORT CUDA FP32",
        "streamfer CUDA FP16": "ORT CUDA FP16",
        "streamfer TensorRT FP16": "ORT TensorRT FP16",
    }
    for prefix, ort_name in pairs.items():
        if name.startswith(prefix):
            return raw.get(ort_name)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu_check.sh", description=__doc__)
    parser.add_argument("--model", type=Path, default=Path(".gpu/heavy.onnx"))
    parser.add_argument("--fp16-model", type=Path, default=Path(".gpu/heavy-fp16.onnx"))
    parser.add_argument("--budget-s", type=float, default=2.0, help="seconds timed per row")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = parser.parse_args(argv)
    # the engine's own lines: which provider serves, pinned buffers or not, TensorRT's build
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    report = Report(environment=environment())
    model, fp16 = _models(args.model, args.fp16_model, report)
    x = np.ascontiguousarray(np.resize(_features(), (BATCH, 30)))
    ref = ort_rows(report, model, fp16, x, args.budget_s)
    engine_rows(report, model, fp16, x, ref, args.budget_s)
    torch_rows(report, model, x, ref, args.budget_s)
    if any(name.startswith(("ORT CUDA", "ORT TensorRT")) for name, _ in report.skipped):
        report.notes.append(
            "the GPU builds of ONNX Runtime are larger than the "
            f"{CARRY_LIMIT // (1024 * 1024)} MiB one device call carries ("
            + "; ".join(f"{name}: {size:,} bytes" for name, size in WHEEL_SIZES.items())
            + "): bash benchmarks/gpu_prepare.sh cuts one into pieces and prints the calls "
            "that carry them (benchmarks/README.md)"
        )
    text = render(report)
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2, default=str))
        print(f"\nfigures written to {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
