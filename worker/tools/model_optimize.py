"""``streamfer model optimize``: an FP16 or INT8 copy of a model, written only when its
answers on held-out rows stay close to the FP32 model's: a classifier's labels within
``max_drop``, a model with no label (a regressor) within the output tolerances (see
``worker.tools.model_tolerance``).

- FP16: ONNX Runtime's own converter (``onnxruntime.transformers.float16``) with float32
  inputs and outputs kept, so a worker feeds the copy exactly as it fed the original.
  Ops outside the standard ONNX domain (ai.onnx.ml, custom domains; ORT's own
  com.microsoft ops excepted) and those the converter knows have no float16 kernels stay
  float32. A model none of whose weights would turn float16 (a tree ensemble, whose
  weights live in its ops' attributes) is refused. ONNX Runtime's CPU provider computes
  most float16 ops in float32 (it casts around them), so the comparison there measures
  the weights' rounding; rows whose inputs lie beyond float16's range (±65504), which
  the input cast turns into inf on a device that computes in float16, count as
  differing. The widely used onnxconverter-common is not used: its 1.15 and 1.16
  releases (1.14 pins protobuf 3.20) leave a Cast to float whose output they retyped
  float16, which ONNX Runtime refuses to load; every scikit-learn MLP pipeline meets it.
- INT8: ``onnxruntime.quantization`` after ``quant_pre_process`` (ONNX shape inference
  only; its graph optimization and symbolic shape inference are skipped, see below):
  static QDQ (int8 weights and activations, MinMax ranges) with calibration rows, else
  dynamic (int8 weights, activations quantized per batch at run time).

The FP16 converter leaves nodes out of topological order; they are sorted back, and
every copy passes ``onnx.checker``'s full check before it is compared, or the command
fails (EngineError) naming the file and writing nothing.

The comparison rows are ``eval_rows``, or else every 5th calibration row, held out of
calibration (FP16 fits nothing, so it compares on every calibration row). The copy is
made in a temporary directory and copied to ``output`` only when accepted: a refused
model leaves nothing behind. Bad arguments, rows or a model with nothing to convert
raise ``ConfigError``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from worker.config import ModelSpec
from worker.errors import ConfigError
from worker.inference import Feeds, OnnxEngine
from worker.tools.model_check import check_model_file, sort_nodes
from worker.tools.model_compare import SPEED_BATCH, Comparison, compare_models
from worker.tools.model_inspect import ONNX_DOMAIN, load_onnx
from worker.tools.model_rows import ModelRows, read_model_rows
from worker.tools.model_tolerance import Verdict, check_tolerances, judge

__all__ = ["Conversion", "OptimizeOptions", "OptimizeOutcome", "optimize_model"]

Mode = Literal["fp16", "int8"]

HOLD_OUT_EVERY = 5
CALIBRATION_BATCH = 128

# Domains whose ops the FP16 converter may turn float16 (ORT's contrib ops included).
_FP16_DOMAINS = frozenset({"", ONNX_DOMAIN, "com.microsoft"})
_FLOAT, _FLOAT16, _INT8, _UINT8 = 1, 10, 3, 2  # onnx.TensorProto data types
# Which inputs of the quantized graph's ops are zero points, not weights.
_ZERO_POINT_INPUTS = {
    "QuantizeLinear": slice(2, 3),
    "DequantizeLinear": slice(2, 3),
    "MatMulInteger": slice(2, 4),
    "ConvInteger": slice(2, 4),
}


@dataclass(frozen=True, slots=True)
class OptimizeOptions:
    mode: Mode
    calibration: Path | None = None
    eval_rows: Path | None = None
    output: Path | None = None
    """Default ``<stem>.fp16.onnx`` / ``<stem>.int8.onnx`` next to the model."""
    max_drop: float = 0.01
    max_abs_diff: float | None = None
    max_mean_abs_diff: float | None = None
    """Output tolerances; None: the default for a model with no label, none for a
    classifier (``worker.tools.model_tolerance``)."""
    speed_seconds: float = 2.0
    """Timing per model; the two take turns."""


@dataclass(frozen=True, slots=True)
class Conversion:
    method: str
    changed: str
    """What turned float16 or int8, in a phrase."""
    note: str | None = None


@dataclass(frozen=True, slots=True)
class OptimizeOutcome:
    model: Path
    output: Path
    mode: Mode
    conversion: Conversion
    rows_from: str
    comparison: Comparison
    sizes: tuple[int, int]
    """Bytes of the FP32 file and of the optimized one."""
    max_drop: float
    verdict: Verdict
    speed_seconds: float

    @property
    def written(self) -> bool:
        return not self.verdict.refusals

    @property
    def refused(self) -> str | None:
        if self.written:
            return None
        return "; ".join(self.verdict.refusals) + "; nothing written"

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": str(self.model),
            "output": str(self.output),
            "mode": self.mode,
            "method": self.conversion.method,
            "changed": self.conversion.changed,
            "note": self.conversion.note,
            "rows_from": self.rows_from,
            **self.comparison.as_dict(),
            "size_bytes": {"fp32": self.sizes[0], self.mode: self.sizes[1]},
            "max_drop": self.max_drop,
            "allowed_rows": self.verdict.allowed_rows,
            "max_abs_diff": self.verdict.max_abs_diff,
            "max_mean_abs_diff": self.verdict.max_mean_abs_diff,
            "written": str(self.output) if self.written else None,
            "refused": self.refused,
        }

    def text(self) -> str:
        c = self.comparison
        a, b = c.reference_speed, c.candidate_speed
        lines = [
            f"model        {self.model} -> {self.output}",
            f"method       {self.conversion.method}",
            f"changed      {self.conversion.changed}",
        ]
        if self.conversion.note:
            lines.append(f"note         {self.conversion.note}")
        lines += [f"compared on  {self.rows_from}", self._labels_line(), *self._diff_lines()]
        if c.nonfinite_rows:
            lines.append(f"non-finite   {c.nonfinite_rows} rows have NaN or inf outputs")
        if c.unsafe_rows:
            lines.append(
                f"float16      {c.unsafe_rows} rows have inputs beyond +-65504, inf once cast "
                f"to float16{': counted as differing' if c.agreeing is not None else ''}"
            )
        lines += [
            f"speed        ONNX Runtime CPU, 1 intra-op thread, batch {SPEED_BATCH}, "
            f"{self.speed_seconds:g} s each, this machine",
            f"{'':13}{'fp32':>12}{self.mode:>12}",
            f"{'size':13}{_size(self.sizes[0]):>12}{_size(self.sizes[1]):>12}",
            f"{'rows/s':13}{a.rows_per_s:>12,.0f}{b.rows_per_s:>12,.0f}"
            f"   x{b.rows_per_s / a.rows_per_s:.2f}",
            f"{'p99 ms':13}{a.p99_ms:>12.2f}{b.p99_ms:>12.2f}",
            f"written      {self.output}" if self.written else f"refused      {self.refused}",
        ]
        return "\n".join(lines)

    def _labels_line(self) -> str:
        c = self.comparison
        if c.agreeing is None:
            return "labels       none (no label output, one output column): outputs compared"
        share = c.agreeing / c.rows
        return (
            f"labels       {c.agreeing} of {c.rows} agree with FP32 ({100 * share:.2f}%, "
            f"from {c.labels_from}): drop {1 - share:.4f}, --max-drop {self.max_drop:g}"
        )

    def _diff_lines(self) -> list[str]:
        c, v = self.comparison, self.verdict
        if c.max_score_diff is None or c.mean_score_diff is None:
            return []
        bound = {
            flag: f" (--{flag} {allowed:g})" if allowed is not None else ""
            for flag, allowed in (
                ("max-abs-diff", v.max_abs_diff),
                ("max-mean-abs-diff", v.max_mean_abs_diff),
            )
        }
        line = (
            f"max |diff| {c.max_score_diff:.3g}{bound['max-abs-diff']}, mean "
            f"{c.mean_score_diff:.3g}{bound['max-mean-abs-diff']} (output {c.scores_from})"
        )
        if c.agreeing is not None:
            return [f"scores       {line}"]
        return [f"outputs      {line}", f"{'':13}FP32's outputs reach {c.max_abs_output:.4g}"]


def optimize_model(path: Path, options: OptimizeOptions) -> OptimizeOutcome:
    """Convert, compare and, when the drop is within ``max_drop``, write the copy.

    Raises ConfigError for bad options, rows or a model with nothing to convert;
    EngineError when a model does not load or run.
    """
    check_tolerances(options.max_drop, options.max_abs_diff, options.max_mean_abs_diff)
    if not options.speed_seconds > 0:
        raise ConfigError(f"--speed-s must be positive, not {options.speed_seconds}")
    if options.calibration is None and options.eval_rows is None:
        raise ConfigError(
            f"--{options.mode} needs rows to compare on: give "
            + (
                "--eval FILE.csv or --calibration FILE.csv"
                if options.mode == "fp16"
                else "--calibration FILE.csv (static quantization; every 5th row is held out "
                "to compare on) or --eval FILE.csv (dynamic quantization)"
            )
        )
    output = options.output or path.with_name(f"{path.stem}.{options.mode}.onnx")
    if output.resolve() == path.resolve():
        raise ConfigError(f"--output {output} is the model itself")
    if not output.parent.is_dir():
        raise ConfigError(f"--output {output}: no directory {output.parent}")
    model = load_onnx(path, weights=options.mode == "fp16")
    reference = _engine(path)
    calibration, compared, rows_from = _rows(options, reference)
    with tempfile.TemporaryDirectory(prefix="streamfer-optimize-") as work:
        made = Path(work) / output.name
        if options.mode == "fp16":
            conversion = convert_fp16(model, made, path)
        else:
            conversion = quantize_int8(path, made, calibration, Path(work))
        check_model_file(made, f"{output} (the {options.mode} copy of {path}; not written)")
        comparison = compare_models(
            reference,
            _engine(made),
            compared,
            seconds=options.speed_seconds,
            unsafe=_beyond_float16(compared) if options.mode == "fp16" else None,
        )
        verdict = judge(
            comparison, options.max_drop, options.max_abs_diff, options.max_mean_abs_diff
        )
        if not verdict.refusals:
            partial = output.with_name(output.name + ".partial")
            shutil.copyfile(made, partial)
            partial.replace(output)
        sizes = (path.stat().st_size, made.stat().st_size)
    return OptimizeOutcome(
        model=path,
        output=output,
        mode=options.mode,
        conversion=conversion,
        rows_from=rows_from,
        comparison=comparison,
        sizes=sizes,
        max_drop=options.max_drop,
        verdict=verdict,
        speed_seconds=options.speed_seconds,
    )


def _engine(path: Path) -> OnnxEngine:
    """ONNX Runtime CPU, one intra-op thread: as a worker runs the model."""
    return OnnxEngine(ModelSpec(path=path, name=path.stem, intra_op_threads=1))


def _rows(options: OptimizeOptions, engine: OnnxEngine) -> tuple[ModelRows | None, ModelRows, str]:
    """(calibration rows, rows to compare on, where those come from)."""
    inputs = engine.inputs
    calibration = read_model_rows(options.calibration, inputs) if options.calibration else None
    if options.eval_rows is not None:
        compared = read_model_rows(options.eval_rows, inputs)
        return calibration, compared, f"the {compared.count} rows of {options.eval_rows}"
    assert calibration is not None
    if options.mode == "fp16":
        return None, calibration, f"all {calibration.count} rows of {options.calibration}"
    kept, held = calibration.split_every(HOLD_OUT_EVERY)
    if held.count == 0:
        raise ConfigError(
            f"{options.calibration}: {calibration.count} rows; holding out every "
            f"{HOLD_OUT_EVERY}th to compare on needs at least {HOLD_OUT_EVERY} (or give --eval)"
        )
    where = (
        f"{held.count} rows held out of {options.calibration} (every {HOLD_OUT_EVERY}th; "
        f"the other {kept.count} calibrate)"
    )
    return kept, held, where


def convert_fp16(model: Any, output: Path, source: Path) -> Conversion:
    """Write ``model`` (an ``onnx.ModelProto``, changed in place) as FP16 to ``output``.

    Raises ConfigError when none of its weights would turn float16.
    """
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    nodes = list(model.graph.node)
    foreign = {n.op_type for n in nodes if n.domain not in _FP16_DOMAINS}
    blocked = set(DEFAULT_OP_BLOCK_LIST) | foreign
    kept = sorted({n.op_type for n in nodes if n.op_type in blocked})
    _float_data_to_raw(model)
    before = _weights(model, _FLOAT)
    converted = convert_float_to_float16(model, keep_io_types=True, op_block_list=sorted(blocked))
    sort_nodes(converted.graph)  # the converter appends its Casts after their readers
    after = _weights(converted, _FLOAT16)
    if not after:
        raise ConfigError(
            f"{source}: nothing to convert to FP16: no float32 weight feeds an op that runs "
            f"in float16; its ops {sorted({n.op_type for n in nodes})} keep their weights in "
            f"attributes or stay float32 ({', '.join(kept) or 'none'} have no float16 kernels "
            "in ONNX Runtime)"
        )
    onnx.save(converted, str(output))
    stays = f"; kept float32: {', '.join(kept)}" if kept else ""
    return Conversion(
        method="fp16 (ONNX Runtime's converter; float32 inputs and outputs kept)",
        note="ONNX Runtime CPU computes most float16 ops in float32, so these figures "
        "measure the weights' rounding; on a GPU activations are float16 too",
        changed=f"{len(after)} of {len(before)} float32 weights to float16 "
        f"({_size(sum(before[n] for n in after if n in before))} -> "
        f"{_size(sum(after.values()))}){stays}",
    )


def quantize_int8(
    path: Path, output: Path, calibration: ModelRows | None, work: Path
) -> Conversion:
    """Write ``path`` quantized to ``output``: static QDQ on ``calibration``, or dynamic.

    Raises ConfigError when ONNX Runtime quantized nothing of the model.
    """
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_dynamic,
        quantize_static,
    )

    class Rows(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self, rows: ModelRows) -> None:
            self._batches: Iterator[Feeds] = rows.batches(CALIBRATION_BATCH)

        def get_next(self) -> Feeds | None:
            return next(self._batches, None)

    prepared, note = work / "prepared.onnx", None
    try:
        # ONNX shape inference only (positional: the names changed across releases). The
        # graph optimization step drops the Cast after a scikit-learn Scaler, the one node
        # that types what the MLP behind it consumes (ai.onnx.ml ops declare no output
        # types), and the quantizer skips every untyped activation; ONNX Runtime
        # optimizes the quantized graph when it loads it anyway. Symbolic shape inference
        # (for transformers' symbolic dims) fails on ai.onnx.ml ops, and then writes
        # sym_shape_infer_temp.onnx into the working directory.
        quant_pre_process(str(path), str(prepared), True, False, True)
    except Exception as exc:  # shape inference raises what its ops raise
        prepared = path
        note = f"quant_pre_process failed ({str(exc).splitlines()[0][:200]}); quantized as is"
    if calibration is None:
        quantize_dynamic(str(prepared), str(output), weight_type=QuantType.QInt8)
        method = "int8 dynamic (int8 weights; activations quantized per batch at run time)"
    else:
        quantize_static(
            str(prepared),
            str(output),
            Rows(calibration),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
        )
        method = (
            f"int8 static (QDQ, int8 weights and activations, MinMax ranges from "
            f"{calibration.count} calibration rows)"
        )
    quantized = onnx.load(str(output))
    zero_points = {
        name
        for n in quantized.graph.node
        if n.op_type in _ZERO_POINT_INPUTS
        for name in n.input[_ZERO_POINT_INPUTS[n.op_type]]
    }
    weights = {
        name: size
        for name, size in (_weights(quantized, _INT8) | _weights(quantized, _UINT8)).items()
        if name not in zero_points
    }
    activations = sum(
        n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear") for n in quantized.graph.node
    )
    if not weights and not activations:
        ops = sorted({n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node})
        raise ConfigError(
            f"{path}: nothing to quantize: ONNX Runtime quantizes MatMul, Gemm, Conv and "
            f"similar ops, and this model's ops are {ops}"
        )
    return Conversion(
        method=method,
        changed=f"{len(weights)} weights to int8 ({_size(sum(weights.values()))}), "
        f"{activations} activation quantizers",
        note=note,
    )


def _beyond_float16(rows: ModelRows) -> npt.NDArray[np.bool_]:
    """Rows with a float input beyond float16's largest finite value."""
    limit = float(np.finfo(np.float16).max)
    beyond = np.zeros(rows.count, dtype=bool)
    for values in rows.feeds.values():
        if values.dtype.kind == "f":
            beyond |= (np.abs(values.reshape(rows.count, -1)) > limit).any(axis=1)
    return beyond


def _float_data_to_raw(model: Any) -> None:
    """Float32 weights moved from ``float_data`` (where skl2onnx writes them) to
    ``raw_data``, losslessly. The converter turns ``float_data`` into float16 one value
    at a time in Python (20 s for the benchmarks' 2.7M-weight MLP) and writes varints
    (a quarter larger than raw float16); ``raw_data`` it converts with numpy."""
    from onnx import numpy_helper

    tensors = list(model.graph.initializer) + [
        a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute
    ]
    for t in tensors:
        if t.data_type == _FLOAT and len(t.float_data):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t), t.name))


def _weights(model: Any, data_type: int) -> dict[str, int]:
    """Initializers (and Constant values) of ``data_type``: name -> bytes."""
    from onnx import numpy_helper

    found = {
        t.name: numpy_helper.to_array(t).nbytes
        for t in model.graph.initializer
        if t.data_type == data_type
    }
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and attr.t.data_type == data_type:
                    found[node.output[0]] = numpy_helper.to_array(attr.t).nbytes
    return found


def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"
