"""Split a file too large for one carry to the device machine into numbered pieces, and
put it back together there, checked.

The device machine takes at most 64 MiB of files per call, and the GPU build of ONNX
Runtime is a 255 MB wheel, so ``split`` cuts it into folders ``OUT/01``, ``OUT/02``...
of one piece each (every piece at most ``--max-bytes``), each folder with the whole
manifest (name, size and SHA-256 of the file and of every piece). One call carries one
folder, and ``store`` copies it into a store that outlives the call (the machine keeps
its files between calls while it stays warm); ``join`` checks that every piece is there
and intact, naming the first that is not, concatenates them and checks the whole.

Standard library only: it runs on the device's own python, which has no package index.
Run as ``python3 -m benchmarks.pieces {split,store,join} ...`` from the repository root.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "MANIFEST",
    "Manifest",
    "Piece",
    "PieceError",
    "join",
    "main",
    "read_manifest",
    "split",
    "store",
]

MANIFEST = "manifest.json"
CHUNK = 1024 * 1024


class PieceError(Exception):
    """A piece is missing, has the wrong size or digest, or the whole does not match."""


@dataclass(frozen=True, slots=True)
class Piece:
    index: int
    name: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Manifest:
    name: str
    size: int
    sha256: str
    pieces: tuple[Piece, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        pieces = tuple(Piece(**p) for p in raw["pieces"])
        return cls(raw["name"], raw["size"], raw["sha256"], pieces)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _folder(index: int) -> str:
    return f"{index:02d}"


def split(path: Path, out: Path, max_bytes: int) -> Manifest:
    """Cut ``path`` into ``out/01/``, ``out/02/``... (pieces of at most ``max_bytes``, each
    folder with the manifest) and return the manifest. ``out`` is emptied first."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be positive, not {max_bytes}")
    if out.exists():
        shutil.rmtree(out)
    pieces: list[Piece] = []
    whole = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(max_bytes):
            index = len(pieces) + 1
            folder = out / _folder(index)
            folder.mkdir(parents=True)
            name = f"{path.name}.part{index:02d}"
            (folder / name).write_bytes(block)
            whole.update(block)
            size += len(block)
            pieces.append(Piece(index, name, len(block), hashlib.sha256(block).hexdigest()))
    manifest = Manifest(path.name, size, whole.hexdigest(), tuple(pieces))
    for piece in pieces:
        (out / _folder(piece.index) / MANIFEST).write_text(manifest.to_json())
    return manifest


def read_manifest(folder: Path) -> Manifest:
    """The manifest in ``folder``; PieceError if there is none."""
    path = folder / MANIFEST
    if not path.is_file():
        raise PieceError(f"no {MANIFEST} in {folder}: not a piece folder from split")
    return Manifest.from_json(path.read_text())


def _check(piece: Piece, path: Path) -> None:
    if not path.is_file():
        raise PieceError(f"piece {piece.index} ({piece.name}) is missing from {path.parent}")
    size = path.stat().st_size
    if size != piece.size:
        raise PieceError(
            f"piece {piece.index} ({piece.name}) is {size} bytes, the manifest says {piece.size}"
        )
    if _sha256(path) != piece.sha256:
        raise PieceError(f"piece {piece.index} ({piece.name}) is corrupted: its SHA-256 differs")


def store(folder: Path, into: Path) -> list[int]:
    """Check the pieces in ``folder`` against its manifest and copy them (and the
    manifest) into ``into``; returns the indexes of the pieces ``into`` now lacks."""
    manifest = read_manifest(folder)
    into.mkdir(parents=True, exist_ok=True)
    kept = into / MANIFEST
    if kept.is_file() and read_manifest(into).sha256 != manifest.sha256:
        raise PieceError(f"{into} holds pieces of another file: empty it first")
    here = [p for p in manifest.pieces if (folder / p.name).is_file()]
    if not here:
        raise PieceError(f"{folder} holds no piece named in its manifest")
    for piece in here:
        _check(piece, folder / piece.name)
        shutil.copyfile(folder / piece.name, into / piece.name)
    kept.write_text(manifest.to_json())
    return [p.index for p in manifest.pieces if not (into / p.name).is_file()]


def join(folder: Path, out: Path) -> Path:
    """Check every piece in ``folder``, concatenate them into ``out/<name>`` and check the
    whole's size and SHA-256; PieceError names the first piece missing or corrupted."""
    manifest = read_manifest(folder)
    missing = [p for p in manifest.pieces if not (folder / p.name).is_file()]
    if missing:
        names = ", ".join(f"{p.index} ({p.name})" for p in missing)
        raise PieceError(f"{len(missing)} of {len(manifest.pieces)} pieces missing: {names}")
    for piece in manifest.pieces:
        _check(piece, folder / piece.name)
    out.mkdir(parents=True, exist_ok=True)
    target = out / manifest.name
    with target.open("wb") as whole:
        for piece in manifest.pieces:
            with (folder / piece.name).open("rb") as part:
                shutil.copyfileobj(part, whole, CHUNK)
    if target.stat().st_size != manifest.size or _sha256(target) != manifest.sha256:
        target.unlink()
        raise PieceError(f"{manifest.name} joined does not match its manifest's SHA-256")
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.pieces", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    cut = verbs.add_parser("split", help="cut FILE into OUT/01, OUT/02...")
    cut.add_argument("file", type=Path)
    cut.add_argument("--out", type=Path, required=True)
    cut.add_argument("--max-bytes", type=int, required=True, help="largest piece, in bytes")
    keep = verbs.add_parser("store", help="check one piece folder and copy it into a store")
    keep.add_argument("folder", type=Path)
    keep.add_argument("--into", type=Path, required=True)
    glue = verbs.add_parser("join", help="check a store's pieces and join them into OUT")
    glue.add_argument("folder", type=Path)
    glue.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.verb == "split":
            made = split(args.file, args.out, args.max_bytes)
            sizes = ", ".join(f"{p.size:,}" for p in made.pieces)
            print(f"pieces: {made.name} ({made.size:,} bytes) in {len(made.pieces)}: {sizes}")
        elif args.verb == "store":
            lacking = store(args.folder, args.into)
            total = len(read_manifest(args.into).pieces)
            print(f"pieces: {args.into} holds {total - len(lacking)} of {total}; lacks {lacking}")
        else:
            print(join(args.folder, args.out))
    except PieceError as exc:
        print(f"pieces: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
