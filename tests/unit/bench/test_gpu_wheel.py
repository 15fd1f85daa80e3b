"""Which onnxruntime-gpu wheel the device check carries and the calls that carry it
(benchmarks/gpu_wheel.py), from pip reports shaped like the index's answers: no network."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu_wheel import SelectError, choose, cuda_major, main, plan

ROOT = Path(__file__).resolve().parents[3]
MIB = 1024 * 1024
CUDA13 = [
    "flatbuffers",
    "numpy>=1.21.6",
    'sympy; extra == "symbolic"',
    'nvidia-cuda-nvrtc~=13.0; extra == "cuda"',
    'nvidia-cuda-runtime~=13.0; extra == "cuda"',
    'nvidia-cufft~=12.0; extra == "cuda"',
    'nvidia-cudnn-cu13~=9.0; extra == "cudnn"',
]
CUDA12 = [
    "coloredlogs",
    'nvidia-cuda-nvrtc-cu12~=12.0; extra == "cuda"',
    'nvidia-cuda-runtime-cu12~=12.0; extra == "cuda"',
    'nvidia-cudnn-cu12~=9.0; extra == "cudnn"',
]


def _report(version: str, filename: str, requires: list[str], sha: str = "ab" * 32) -> Any:
    url = f"https://files.pythonhosted.org/packages/xx/{filename}"
    hashes = {"sha256": sha} if sha else {}
    return {
        "install": [
            {
                "download_info": {"url": url, "archive_info": {"hashes": hashes}},
                "metadata": {
                    "name": "onnxruntime-gpu",
                    "version": version,
                    "requires_dist": requires,
                },
            }
        ]
    }


def test_the_cuda_major_comes_from_the_cuda_extras_runtime() -> None:
    assert cuda_major(CUDA13) == 13
    assert cuda_major(CUDA12) == 12
    assert cuda_major(["numpy", "nvidia-cuda-runtime~=13.0"]) is None  # not the extra
    assert cuda_major(["coloredlogs", "numpy"]) is None


def test_a_cuda_13_wheel_for_the_devices_python_is_chosen() -> None:
    name = "onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    wheel = choose(_report("1.31.1", name, CUDA13), cuda=13, python_tag="cp312")
    assert (wheel.filename, wheel.version, wheel.cuda, wheel.sha256) == (
        name,
        "1.31.1",
        13,
        "ab" * 32,
    )


@pytest.mark.parametrize(
    ("report", "reason"),
    [
        (
            _report(
                "1.23.2", "onnxruntime_gpu-1.23.2-cp312-cp312-manylinux_2_28_x86_64.whl", CUDA12
            ),
            "built for CUDA 12: the device's PyTorch brings CUDA 13",
        ),
        (
            _report(
                "1.31.1", "onnxruntime_gpu-1.31.1-cp311-cp311-manylinux_2_28_x86_64.whl", CUDA13
            ),
            "is not for cp312",
        ),
        (
            _report(
                "1.18.0", "onnxruntime_gpu-1.18.0-cp312-cp312-manylinux_2_28_x86_64.whl", ["numpy"]
            ),
            "built for CUDA unknown",
        ),
        (
            _report(
                "1.31.1", "onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl", CUDA13, ""
            ),
            "no SHA-256",
        ),
        ({"install": []}, "installs no onnxruntime-gpu"),
    ],
)
def test_a_wheel_that_cannot_serve_there_is_refused_with_the_reason(
    report: Any, reason: str
) -> None:
    with pytest.raises(SelectError, match=reason):
        choose(report, cuda=13, python_tag="cp312")


def test_the_select_cli_prints_what_the_shell_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    (tmp_path / "r.json").write_text(json.dumps(_report("1.31.1", name, CUDA13)))
    assert main(["select", str(tmp_path / "r.json")]) == 0
    url, sha, filename = capsys.readouterr().out.split()
    assert (url.endswith(name), sha, filename) == (True, "ab" * 32, name)
    (tmp_path / "r.json").write_text(json.dumps(_report("1.23.2", name, CUDA12)))
    assert main(["select", str(tmp_path / "r.json")]) == 1
    assert "CUDA 12" in capsys.readouterr().err


def _pieces(root: Path, sizes: list[int]) -> Path:
    for number, size in enumerate(sizes, start=1):
        folder = root / "pieces" / f"{number:02d}"
        folder.mkdir(parents=True)
        (folder / f"w.whl.part{number:02d}").write_bytes(b"\0" * size)
    extra = root / "extra"
    extra.mkdir()
    (extra / "model.onnx").write_bytes(b"\0" * 3 * MIB)
    return root / "pieces"


def test_one_call_per_piece_the_last_with_the_check_and_its_folders(tmp_path: Path) -> None:
    pieces = _pieces(tmp_path, [56 * MIB, 56 * MIB, 10 * MIB])
    calls = plan(pieces, tree=3 * MIB, last=[tmp_path / "extra"])
    assert [c.carry for c in calls] == [
        (str(pieces / "01"),),
        (str(pieces / "02"),),
        (str(pieces / "03"), str(tmp_path / "extra")),
    ]
    assert [c.size for c in calls] == [59 * MIB, 59 * MIB, 16 * MIB]
    assert calls[0].command.startswith(
        "python3 -c 'import sys; assert sys.version_info[:2] == (3, 12)"
    )
    assert "rm -rf /tmp/streamfer-pieces" in calls[0].command
    assert all(f"store {c.carry[0]} --into /tmp/streamfer-pieces" in c.command for c in calls)
    assert calls[-1].command.endswith('bash benchmarks/gpu_check.sh --json "$OUT/gpu_check.json"')
    assert "gpu_check" not in calls[1].command


def test_a_call_over_the_carry_limit_is_refused(tmp_path: Path) -> None:
    pieces = _pieces(tmp_path, [60 * MIB, 2 * MIB])
    assert len(plan(pieces, tree=4 * MIB, last=[])) == 2  # exactly 64 MiB fits
    with pytest.raises(ValueError, match="call 1 would carry 67,108,865 bytes"):
        plan(pieces, tree=4 * MIB + 1, last=[])
    small = _pieces(tmp_path / "small", [MIB, MIB])
    with pytest.raises(ValueError, match="call 2 would carry 4,194,304 bytes"):  # + 3 MiB
        plan(small, tree=0, last=[tmp_path / "small" / "extra"], limit=2 * MIB)


def test_the_plan_cli_prints_the_run_tools_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pieces = _pieces(tmp_path, [MIB, MIB])
    assert main(["plan", str(pieces), "--last", str(tmp_path / "extra"), "--tree-bytes", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# call 1 of 2: 1.0 MiB with the tree"
    last = json.loads(lines[3])
    assert last["carry"] == [str(pieces / "02"), str(tmp_path / "extra")]
    assert last["timeout_s"] == 480


def test_the_pieces_and_the_wheel_are_never_committed() -> None:
    for path in (
        ".gpu-pieces/01/w.whl.part01",
        ".gpu-wheel/w.whl",
        ".gpu/heavy.onnx",
        ".whl/a.whl",
    ):
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert done.returncode == 0, f"{path} is not git-ignored"
