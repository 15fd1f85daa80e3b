"""Cutting a file into pieces for the device calls and joining them there
(benchmarks/pieces.py): every piece under the limit, the whole back byte for byte, and a
missing or corrupted piece named before anything is installed from it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.pieces import MANIFEST, PieceError, join, main, read_manifest, split, store

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 64 * 1024


def _file(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_larger_than_a_piece_comes_back_whole(tmp_path: Path) -> None:
    wheel = _file(tmp_path / "ort.whl", 3 * LIMIT + 1234)
    manifest = split(wheel, tmp_path / "pieces", LIMIT)
    folders = sorted((tmp_path / "pieces").iterdir())
    assert [f.name for f in folders] == ["01", "02", "03", "04"]
    for folder, piece in zip(folders, manifest.pieces, strict=True):
        assert sorted(p.name for p in folder.iterdir()) == sorted([MANIFEST, piece.name])
        assert (folder / piece.name).stat().st_size <= LIMIT
    assert [p.size for p in manifest.pieces] == [LIMIT, LIMIT, LIMIT, 1234]
    for folder in folders:  # one call each, into the store that outlives the calls
        lacking = store(folder, tmp_path / "store")
    assert lacking == []
    joined = join(tmp_path / "store", tmp_path / "out")
    assert joined.name == "ort.whl"
    assert _digest(joined) == _digest(wheel) == manifest.sha256


@pytest.mark.parametrize(
    ("size", "sizes"),
    [
        (LIMIT - 1, [LIMIT - 1]),
        (LIMIT, [LIMIT]),
        (LIMIT + 1, [LIMIT, 1]),
        (2 * LIMIT, [LIMIT, LIMIT]),
    ],
)
def test_pieces_at_the_limit(tmp_path: Path, size: int, sizes: list[int]) -> None:
    wheel = _file(tmp_path / "w.whl", size)
    manifest = split(wheel, tmp_path / "pieces", LIMIT)
    assert [p.size for p in manifest.pieces] == sizes
    for folder in sorted((tmp_path / "pieces").iterdir()):
        store(folder, tmp_path / "store")
    assert _digest(join(tmp_path / "store", tmp_path / "out")) == _digest(wheel)


def test_the_store_says_what_it_still_lacks_and_join_names_the_missing(tmp_path: Path) -> None:
    split(_file(tmp_path / "w.whl", 3 * LIMIT), tmp_path / "pieces", LIMIT)
    assert store(tmp_path / "pieces" / "01", tmp_path / "store") == [2, 3]
    assert store(tmp_path / "pieces" / "03", tmp_path / "store") == [2]
    with pytest.raises(PieceError, match=r"1 of 3 pieces missing: 2 \(w\.whl\.part02\)"):
        join(tmp_path / "store", tmp_path / "out")
    assert not (tmp_path / "out" / "w.whl").exists()


def test_a_corrupted_piece_is_named(tmp_path: Path) -> None:
    split(_file(tmp_path / "w.whl", 2 * LIMIT), tmp_path / "pieces", LIMIT)
    part = tmp_path / "pieces" / "02" / "w.whl.part02"
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(PieceError, match=r"piece 2 \(w\.whl\.part02\) is corrupted"):
        store(tmp_path / "pieces" / "02", tmp_path / "store")
    part.write_bytes(bytes(data[:-1]))
    with pytest.raises(PieceError, match=r"piece 2 \(w\.whl\.part02\) is 65535 bytes"):
        store(tmp_path / "pieces" / "02", tmp_path / "store")


def test_a_store_of_another_file_is_refused(tmp_path: Path) -> None:
    split(_file(tmp_path / "a.whl", LIMIT), tmp_path / "a", LIMIT)
    split(_file(tmp_path / "b.whl", LIMIT), tmp_path / "b", LIMIT)
    store(tmp_path / "a" / "01", tmp_path / "store")
    with pytest.raises(PieceError, match="holds pieces of another file"):
        store(tmp_path / "b" / "01", tmp_path / "store")
    with pytest.raises(PieceError, match="not a piece folder"):
        read_manifest(tmp_path)


def test_the_cli_prints_progress_and_fails_naming_the_piece(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _file(tmp_path / "w.whl", 2 * LIMIT + 5)
    pieces = tmp_path / "pieces"
    assert (
        main(["split", str(tmp_path / "w.whl"), "--out", str(pieces), "--max-bytes", str(LIMIT)])
        == 0
    )
    assert "in 3: 65,536, 65,536, 5" in capsys.readouterr().out
    assert main(["store", str(pieces / "02"), "--into", str(tmp_path / "s")]) == 0
    assert "holds 1 of 3; lacks [1, 3]" in capsys.readouterr().out
    assert main(["join", str(tmp_path / "s"), "--out", str(tmp_path / "o")]) == 1
    assert "2 of 3 pieces missing: 1 (w.whl.part01), 3 (w.whl.part03)" in capsys.readouterr().err


def test_gpu_check_stops_on_a_missing_piece_before_installing(tmp_path: Path) -> None:
    split(_file(tmp_path / "w.whl", 2 * LIMIT), tmp_path / "pieces", LIMIT)
    store(tmp_path / "pieces" / "01", tmp_path / "store")
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "STREAMFER_GPU_PIECES": str(tmp_path / "store"),
        "STREAMFER_GPU_SITE": str(tmp_path / "site"),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "1 of 2 pieces missing: 2 (w.whl.part02)" in done.stderr
    assert not (tmp_path / "site").exists()
