"""``streamfer model optimize``: FP16 and INT8 copies of real models, each written file
passing ``onnx.checker``'s full check, the accuracy report against FP32, regressors and
one-column models held to output tolerances, refusals (nothing to convert, a drop over
--max-drop, a difference over a tolerance, float16 overflow, a copy failing the
checker), and bad rows.

Tolerances, measured here (onnxruntime 1.32, x86-64), rows differing from FP32 and the
max score difference: the digits MLP 0 of 1797 and 5e-4 in FP16, 1 of 359 held-out rows
and 0.073 in static INT8, 8 of 1797 and 0.081 in dynamic INT8; the skl2onnx MLP 0 rows in
all three, 8e-4 (FP16) and 0.035 (INT8). Outputs with no label, max and mean absolute
difference: the random one-column MLP (values to 6) 0.0023 and 5.6e-4 in FP16, 0.13 and
0.030 in dynamic INT8; the skl2onnx diabetes regressor (values to 124) 0.047 and 0.0050
in FP16. The bounds below leave room for other CPUs' kernels.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from tests.fakes.onnx_models import (
    helper_mlp,
    near_tie_mlp,
    regression_mlp,
    sklearn_mlp,
    sklearn_regressor,
    write_csv,
)
from tests.integration.recipes import NUMERIC, fraud_data, torch_style_mlp
from worker.cli import main
from worker.config import ModelSpec
from worker.inference.engine import OnnxEngine

FAST = ["--speed-s", "0.1", "--json"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def digits(models: Path) -> tuple[Path, Path]:
    path, rows = helper_mlp(models / "digits.onnx")
    return path, write_csv(models / "digits.csv", rows)


@pytest.fixture(scope="module")
def zipmap(models: Path) -> tuple[Path, Path]:
    path, rows = sklearn_mlp(models / "zipmap.onnx")
    return path, write_csv(models / "zipmap.csv", rows)


def checked(path: Path) -> Path:
    """``path``, once it passes onnx.checker's full check (shape inference included)."""
    onnx.checker.check_model(str(path), full_check=True)
    return path


def optimize(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    """(exit code, the JSON report or {}, stderr)."""
    code = main(["model", "optimize", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


@pytest.mark.parametrize(
    ("mode", "rows", "agreement", "max_diff"),
    [
        ("--fp16", "--calibration", 0.995, 0.01),
        ("--int8", "--calibration", 0.98, 0.3),
        ("--int8", "--eval", 0.98, 0.3),
    ],
    ids=["fp16", "int8 static", "int8 dynamic"],
)
def test_an_onnx_helper_mlp_passes_and_is_written_beside_it(
    digits: tuple[Path, Path],
    mode: str,
    rows: str,
    agreement: float,
    max_diff: float,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model, csv = digits
    code, report, err = optimize(
        capsys, str(model), mode, rows, str(csv), "--max-drop", "0.02", *FAST
    )
    assert code == 0, err
    written = model.with_name(f"digits.{mode[2:]}.onnx")
    assert report["written"] == str(checked(written)) and report["refused"] is None
    assert report["rows"] == (1797 // 5 if mode == "--int8" and rows == "--calibration" else 1797)
    assert report["agreement"] >= agreement
    assert report["labels_from"] == "argmax(probabilities)"
    assert 0 < report["max_score_diff"] < max_diff
    assert report["size_bytes"][mode[2:]] < report["size_bytes"]["fp32"]
    for speed in (report["reference_speed"], report["candidate_speed"]):
        assert speed["rows_per_s"] > 0 and speed["p99_ms"] > 0 and speed["batches"] >= 4
    # a worker feeds the copy as it fed the original: float32 in, float32 out
    engine = OnnxEngine(ModelSpec(path=written, name="copy"))
    assert [(t.name, t.onnx_type) for t in engine.inputs] == [("input", "tensor(float)")]
    assert engine.output_types == {"probabilities": "tensor(float)"}
    assert engine.infer(np.zeros((3, 64), np.float32))["probabilities"].dtype == np.float32


@pytest.mark.parametrize("mode", ["--fp16", "--int8"])
def test_zipmap_scores_of_a_default_skl2onnx_export_are_compared(
    zipmap: tuple[Path, Path],
    mode: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model, csv = zipmap
    monkeypatch.chdir(tmp_path)
    code, report, err = optimize(
        capsys, str(model), mode, "--calibration", str(csv), "--output", "copy.onnx", *FAST
    )
    assert code == 0, err
    assert report["written"] == str(checked(Path("copy.onnx")))
    assert [p.name for p in tmp_path.iterdir()] == ["copy.onnx"]  # nothing else left here
    if mode == "--int8":  # shape inference typed every activation: no fallback note
        assert report["note"] is None and report["changed"].endswith(" activation quantizers")
        assert int(report["changed"].split(", ")[-1].split()[0]) >= 4
    assert report["labels_from"] == "output_label"
    assert report["scores_from"] == "output_probability"
    assert report["agreement"] >= 0.99
    assert 0 < report["max_score_diff"] < (0.01 if mode == "--fp16" else 0.2)


def test_the_text_report(zipmap: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    model, csv = zipmap
    out = model.with_name("text.onnx")
    args = [
        str(model),
        "--int8",
        "--calibration",
        str(csv),
        "--output",
        str(out),
        "--speed-s",
        "0.1",
    ]
    assert main(["model", "optimize", *args]) == 0
    text = capsys.readouterr().out
    assert f"compared on  113 rows held out of {csv} (every 5th; the other 456 calibrate)" in text
    assert "agree with FP32" in text and "from output_label" in text
    assert "(output output_probability)" in text
    assert "rows/s" in text and "p99 ms" in text and f"written      {checked(out)}" in text


def test_a_copy_failing_the_checker_is_named_and_not_written(
    zipmap: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without the sort the FP16 converter's graph fails the checker (its Casts come
    after the nodes reading them): the command says which file, and writes nothing."""
    import worker.tools.model_optimize as model_optimize

    monkeypatch.setattr(model_optimize, "sort_nodes", lambda graph: None)
    model, csv = zipmap
    out = tmp_path / "unsorted.onnx"
    code, _, err = optimize(
        capsys, str(model), "--fp16", "--eval", str(csv), "--output", str(out), *FAST
    )
    assert code == 1
    assert f"{out} (the fp16 copy of {model}; not written) fails onnx.checker (full check)" in err
    assert "topologically sorted" in err
    assert list(tmp_path.iterdir()) == []


def test_a_pure_tree_ensemble_has_nothing_to_convert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from streamfer_dev.modelgen import make_classifier

    forest = make_classifier(tmp_path / "forest.onnx", n_estimators=3, max_depth=3, zipmap=True)
    csv = write_csv(tmp_path / "rows.csv", forest.features[:50].astype(np.float64))
    for mode, message in (
        ("--fp16", "nothing to convert to FP16"),
        ("--int8", "nothing to quantize"),
    ):
        code, _, err = optimize(capsys, str(forest.path), mode, "--calibration", str(csv), *FAST)
        assert code == 2
        assert message in err and "TreeEnsembleClassifier" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forest.onnx", "rows.csv"]


def test_a_drop_over_max_drop_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two classes whose logits differ by ~1e-3: INT8 flips about a third of the labels."""
    model, rows = near_tie_mlp(tmp_path / "ties.onnx")
    csv = write_csv(tmp_path / "ties.csv", rows)
    code, report, err = optimize(capsys, str(model), "--int8", "--calibration", str(csv), *FAST)
    assert code == 1
    assert report["drop"] > 0.05 and report["written"] is None
    assert "nothing written" in err and "more than --max-drop 0.01 allows (0 rows)" in err
    assert not model.with_name("ties.int8.onnx").exists()
    assert not list(tmp_path.glob("*.partial"))


@pytest.fixture(scope="module")
def regressor(models: Path) -> tuple[Path, Path]:
    path, rows = sklearn_regressor(models / "diabetes.onnx")
    return path, write_csv(models / "diabetes.csv", rows)


def test_a_regressor_is_held_to_the_output_tolerances(
    regressor: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its outputs reach 124, so FP16's rounding is more than the defaults (made for
    outputs of order one) allow: refused, naming the measured and allowed values."""
    model, csv = regressor
    out = tmp_path / "copy.onnx"
    code, report, err = optimize(
        capsys, str(model), "--fp16", "--eval", str(csv), "--output", str(out), *FAST
    )
    assert code == 1 and not out.exists()
    assert report["labels_from"] is None and report["agreeing"] is None
    assert report["agreement"] is None and report["allowed_rows"] is None
    assert (report["max_abs_diff"], report["max_mean_abs_diff"]) == (0.01, 0.001)
    assert report["scores_from"] == "variable" and report["max_abs_output"] > 100
    measured = report["max_score_diff"], report["mean_score_diff"]
    assert 0.01 < measured[0] < 0.5 and 0.001 < measured[1] < 0.05
    assert (
        f"outputs differ from FP32's by up to {measured[0]:.4g}, more than --max-abs-diff "
        "0.01 allows; " in err
    )
    assert (
        f"outputs differ from FP32's by {measured[1]:.4g} on average, more than "
        f"--max-mean-abs-diff 0.001 allows (FP32's outputs reach {report['max_abs_output']:.4g})"
        "; nothing written" in err
    )


@pytest.mark.parametrize(
    ("flag", "measured", "phrase"),
    [
        ("--max-abs-diff", "max_score_diff", "by up to {:.4g}"),
        ("--max-mean-abs-diff", "mean_score_diff", "by {:.4g} on average"),
    ],
)
def test_a_tolerance_just_under_the_difference_refuses_and_just_over_passes(
    regressor: tuple[Path, Path],
    tmp_path: Path,
    flag: str,
    measured: str,
    phrase: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model, csv = regressor
    out = tmp_path / "copy.onnx"
    loose = ["--max-abs-diff", "1", "--max-mean-abs-diff", "1"]
    args = [str(model), "--fp16", "--eval", str(csv), "--output", str(out), *loose, *FAST]
    code, report, err = optimize(capsys, *args)
    assert code == 0, err
    diff = report[measured]
    under, over = diff * (1 - 1e-3), diff * (1 + 1e-3)
    out.unlink()
    code, report, err = optimize(capsys, *args, flag, repr(under))
    assert code == 1 and not out.exists()
    assert report[measured] == diff and report[flag[2:].replace("-", "_")] == under
    assert f"outputs differ from FP32's {phrase.format(diff)}, more than {flag} {under:g}" in err
    code, report, err = optimize(capsys, *args, flag, repr(over))
    assert code == 0, err
    assert report["written"] == str(checked(out)) and report[measured] == diff


def test_one_output_column_passes_fp16_with_the_defaults_and_not_int8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outputs of order one: FP16's rounding is within 0.01 and 0.001; dynamic INT8's is
    not. The text report says which tolerances held it."""
    model, rows = regression_mlp(tmp_path / "value.onnx")
    csv = write_csv(tmp_path / "rows.csv", rows)
    code, report, err = optimize(capsys, str(model), "--fp16", "--eval", str(csv), *FAST)
    assert code == 0, err
    assert report["written"] == str(checked(model.with_name("value.fp16.onnx")))
    assert report["labels_from"] is None and report["scores_from"] == "value"
    assert 0 < report["max_score_diff"] <= 0.01 and 0 < report["mean_score_diff"] <= 0.001
    code = main(["model", "optimize", str(model), "--int8", "--eval", str(csv), "--speed-s", "0.1"])
    out, err = capsys.readouterr()
    assert code == 1 and not model.with_name("value.int8.onnx").exists()
    assert "labels       none (no label output, one output column): outputs compared" in out
    assert "outputs      max |diff| " in out and "(--max-abs-diff 0.01), mean " in out
    assert "(--max-mean-abs-diff 0.001) (output value)" in out
    assert "more than --max-mean-abs-diff 0.001 allows" in err and "nothing written" in err


def test_inputs_beyond_float16_refuse_a_model_with_no_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, rows = regression_mlp(tmp_path / "value.onnx")
    rows[:3, 0] = 1e5
    csv = write_csv(tmp_path / "rows.csv", rows)
    code, report, err = optimize(
        capsys, str(model), "--fp16", "--eval", str(csv), "--max-abs-diff", "1e9", *FAST
    )
    assert code == 1 and report["unsafe_rows"] == 3
    assert "3 of 100 rows have inputs beyond float16's +-65504" in err


def test_a_classifier_is_held_to_a_tolerance_given(
    digits: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, csv = digits
    out = tmp_path / "copy.onnx"
    code, report, err = optimize(
        capsys,
        *(str(model), "--fp16", "--eval", str(csv), "--output", str(out)),
        *("--max-abs-diff", "1e-6", *FAST),
    )
    assert code == 1 and not out.exists()
    assert report["agreement"] == 1.0 and report["max_abs_diff"] == 1e-6
    assert report["max_mean_abs_diff"] is None
    assert "more than --max-abs-diff 1e-06 allows" in err and "labels differ" not in err


def test_inputs_beyond_float16_count_as_differing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fraud MLP takes raw numbers: a 30-day volume above 65504 is inf in float16.
    ONNX Runtime CPU computes the FP16 copy's Gemms in float32 and would not show it."""
    data = fraud_data(600)
    recipe = torch_style_mlp(tmp_path, data)
    rows = np.array([[row[c] for c in NUMERIC] for row in data.rows()], dtype=np.float64)
    csv = write_csv(tmp_path / "fraud.csv", rows, NUMERIC)
    beyond = int((np.abs(rows) > 65504).any(axis=1).sum())
    assert beyond > 6, "the data no longer reaches beyond float16's range"
    code, report, err = optimize(
        capsys, str(recipe.model_path), "--fp16", "--calibration", str(csv), *FAST
    )
    assert code == 1
    assert report["unsafe_rows"] == beyond and report["nonfinite_rows"] == 0
    assert report["rows"] - report["agreeing"] >= beyond
    assert f"{beyond} of them for inputs beyond float16" in err


@pytest.mark.parametrize(
    ("csv_text", "message"),
    [
        ("a,b\n1,2\n", "the header has 2 columns"),
        ("{header}\n{row}\n{row},9\n", "line 3 has 65 columns, the header has 64"),
        ("{header}\n{row}\n{bad}\n", "line 3, column 64 ('c63'): 'x' is not a number"),
    ],
    ids=["header width", "row width", "not a number"],
)
def test_bad_rows_exit_2_naming_them(
    digits: tuple[Path, Path],
    tmp_path: Path,
    csv_text: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model, _ = digits
    header = ",".join(f"c{i}" for i in range(64))
    row = ",".join(["0.5"] * 64)
    csv = tmp_path / "bad.csv"
    csv.write_text(csv_text.format(header=header, row=row, bad=row[:-3] + "x"))
    out = tmp_path / "out.onnx"
    code, _, err = optimize(capsys, str(model), "--fp16", "--eval", str(csv), "--output", str(out))
    assert code == 2
    assert f"{csv}: " in err and message in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fp16"], "--fp16 needs rows to compare on: give --eval FILE.csv or --calibration"),
        (["--int8"], "--int8 needs rows to compare on: give --calibration FILE.csv (static"),
        (["--fp16", "--eval", "missing.csv"], "missing.csv: no such file"),
        (["--fp16", "--eval", "x.csv", "--max-drop", "2"], "--max-drop must be between 0 and 1"),
        (["--fp16", "--eval", "x.csv", "--max-abs-diff", "-1"], "--max-abs-diff must be a finite"),
        (["--fp16", "--eval", "x.csv", "--max-mean-abs-diff", "inf"], "must be a finite number"),
        (["--fp16", "--eval", "x.csv", "--output", "{model}"], "is the model itself"),
    ],
    ids=[
        "fp16 without rows",
        "int8 without rows",
        "missing rows",
        "max-drop",
        "max-abs-diff",
        "max-mean-abs-diff",
        "overwrite",
    ],
)
def test_bad_usage_exits_2(
    digits: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model, _ = digits
    monkeypatch.chdir(tmp_path)
    filled = [a.format(model=model) for a in args]
    code, _, err = optimize(capsys, str(model), *filled)
    assert code == 2
    assert message in err
