"""Which onnxruntime-gpu wheel the device check carries, and the calls that carry it.

``bash benchmarks/gpu_prepare.sh`` asks pip for the wheel's index entry (``pip install
--dry-run --report``, which reads the wheel's metadata without fetching the wheel) and
``select`` reads that report: the wheel must be for the device's python and for the CUDA
major version whose libraries the device's PyTorch already brings (13), read from the
``cuda`` extra's ``nvidia-cuda-runtime`` requirement. A CUDA 12 build would also need
NVIDIA's cu12 runtime wheels, several hundred MB more than 15 minutes of device time can
carry, so it is refused. ``plan`` turns the piece folders ``benchmarks.pieces`` made into
the sequence of device calls, each under the carry limit with the working tree counted.

Standard library only, like ``benchmarks.pieces``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CARRY_LIMIT",
    "Call",
    "SelectError",
    "Wheel",
    "choose",
    "cuda_major",
    "main",
    "plan",
    "tree_bytes",
]

CARRY_LIMIT = 64 * 1024 * 1024
"""What one device call may carry, the working tree included."""
STORE = "/tmp/streamfer-pieces"
"""Where each call keeps its piece on the device machine, for the last call to join."""
_RUNTIME = re.compile(r"^nvidia-cuda-runtime(?:-cu(\d+))?\s*(?:~=|==|>=)\s*(\d+)", re.I)


class SelectError(Exception):
    """No wheel in the report can serve on the device, with the reason."""


@dataclass(frozen=True, slots=True)
class Wheel:
    filename: str
    url: str
    sha256: str
    version: str
    cuda: int


@dataclass(frozen=True, slots=True)
class Call:
    carry: tuple[str, ...]
    size: int
    command: str
    timeout_s: int


def cuda_major(requires_dist: Sequence[str]) -> int | None:
    """The CUDA major version an onnxruntime-gpu build's ``cuda`` extra asks for:
    ``nvidia-cuda-runtime~=13.0`` (CUDA 13 dropped the suffix) or
    ``nvidia-cuda-runtime-cu12~=12.0``; None when it names no runtime (before 1.19)."""
    for line in requires_dist:
        requirement, _, marker = line.partition(";")
        if "cuda" not in marker:
            continue
        found = _RUNTIME.match(requirement.strip())
        if found:
            return int(found.group(1) or found.group(2))
    return None


def choose(report: Mapping[str, Any], cuda: int, python_tag: str) -> Wheel:
    """The onnxruntime-gpu wheel in a pip ``--report`` that serves on the device: for
    ``python_tag`` (``cp312``) and CUDA ``cuda``; SelectError says why not."""
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        if meta.get("name", "").lower() != "onnxruntime-gpu":
            continue
        info = item["download_info"]
        filename = info["url"].rsplit("/", 1)[-1]
        sha256 = info.get("archive_info", {}).get("hashes", {}).get("sha256", "")
        if f"-{python_tag}-" not in filename or "x86_64" not in filename:
            raise SelectError(f"{filename} is not for {python_tag} on x86-64")
        built = cuda_major(meta.get("requires_dist", []))
        if built != cuda:
            raise SelectError(
                f"onnxruntime-gpu {meta['version']} is built for CUDA {built or 'unknown'}: the "
                f"device's PyTorch brings CUDA {cuda} libraries only, and NVIDIA's runtime "
                f"wheels for CUDA {built} are too large to carry too; pick a CUDA {cuda} build"
            )
        if not sha256:
            raise SelectError(f"the index gives no SHA-256 for {filename}")
        return Wheel(filename, info["url"], sha256, meta["version"], built)
    raise SelectError("the report installs no onnxruntime-gpu wheel")


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree_bytes(root: Path) -> int:
    """Bytes of what travels with every call: tracked files and untracked ones git does
    not ignore."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    return sum(_size(root / n.decode()) for n in names if n and (root / n.decode()).is_file())


def plan(
    pieces: Path,
    tree: int,
    last: Sequence[Path],
    limit: int = CARRY_LIMIT,
    python: tuple[int, int] = (3, 12),
) -> list[Call]:
    """One call per piece folder, in order, ``last`` (the folders gpu_check.sh reads)
    carried with the last one; the first checks the device's python is ``python``, the
    wheel's. ValueError names a call over ``limit``."""
    folders = sorted(p for p in pieces.iterdir() if p.is_dir() and p.name.isdigit())
    if not folders:
        raise ValueError(f"no piece folders in {pieces}: run benchmarks/gpu_prepare.sh")
    calls: list[Call] = []
    for number, folder in enumerate(folders, start=1):
        carry = [str(folder)]
        steps = [f"python3 -m benchmarks.pieces store {folder} --into {STORE}"]
        timeout = 120
        if number == 1:  # a machine without the GPU or python 3.12 stops here, not at the end
            check = f"import sys; assert sys.version_info[:2] == {python}, sys.version"
            steps[:0] = [f"python3 -c '{check}'", "nvidia-smi -L", f"rm -rf {STORE}"]
        if number == len(folders):
            carry += [str(p) for p in last]
            steps.append('bash benchmarks/gpu_check.sh --json "$OUT/gpu_check.json"')
            timeout = 480
        command = " && ".join(steps)
        size = tree + sum(_size(Path(c)) for c in carry)
        if size > limit:
            raise ValueError(
                f"call {number} would carry {size:,} bytes (the tree {tree:,} included), "
                f"over the {limit:,} limit: make the pieces smaller"
            )
        calls.append(Call(tuple(carry), size, command, timeout))
    return calls


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu_wheel", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    arguments: dict[str, list[tuple[str, dict[str, Any]]]] = {
        "select": [
            ("report", {"type": Path, "help": "pip install --dry-run --report's file"}),
            ("--cuda", {"type": int, "default": 13}),
            ("--python-tag", {"default": "cp312"}),
        ],
        "plan": [
            ("pieces", {"type": Path, "help": "the folder benchmarks.pieces split wrote"}),
            ("--last", {"type": Path, "action": "append", "default": []}),
            ("--tree-bytes", {"type": int, "default": None}),
        ],
    }
    for verb, options in arguments.items():
        sub = verbs.add_parser(verb)
        for name, settings in options:
            sub.add_argument(name, **settings)
    args = parser.parse_args(argv)
    if args.verb == "select":
        try:
            wheel = choose(json.loads(args.report.read_text()), args.cuda, args.python_tag)
        except SelectError as exc:
            print(f"gpu_wheel: {exc}", file=sys.stderr)
            return 1
        print(wheel.url, wheel.sha256, wheel.filename)
        return 0
    tree = tree_bytes(Path.cwd()) if args.tree_bytes is None else args.tree_bytes
    try:
        made = plan(args.pieces, tree, args.last)
    except ValueError as exc:
        print(f"gpu_wheel: {exc}", file=sys.stderr)
        return 1
    for number, call in enumerate(made, start=1):
        run = {"command": call.command, "carry": list(call.carry), "timeout_s": call.timeout_s}
        print(f"# call {number} of {len(made)}: {call.size / 2**20:.1f} MiB with the tree")
        print(json.dumps(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
