"""Which ONNX Runtime distribution is installed, and the commands that mend a clash.

``onnxruntime``, ``onnxruntime-gpu`` (and ONNX Runtime's other builds) all install one
import package, ``onnxruntime``; so do ``streamfer`` and ``streamfer-gpu`` with ``worker``.
pip knows nothing of this: with two of them installed the files on disk are those of
whichever came last (the CUDA provider is there only if that was onnxruntime-gpu), and
uninstalling one deletes files the other still lists. ``runtime_problem`` reads the
installed distributions' metadata (no import of onnxruntime) and, when an import package
has several owners, says which and exactly what to run; the engines report it at start-up.
``gpu_install_hint`` is the line to add when a GPU provider is asked of the CPU runtime.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from collections.abc import Mapping, Sequence

__all__ = [
    "Owners",
    "gpu_install_hint",
    "installed_owners",
    "runtime_distribution",
    "runtime_problem",
]

# import package -> the (distribution, version) pairs that install it
Owners = Mapping[str, Sequence[tuple[str, str]]]

CPU_RUNTIME = "onnxruntime"
GPU_RUNTIME = "onnxruntime-gpu"
CPU_DISTRIBUTION = "streamfer"
GPU_DISTRIBUTION = "streamfer-gpu"
_FROM_CHECKOUT = (
    "(from a checkout: python scripts/build_gpu_dist.py wheel, then pip install the wheel "
    "it writes to dist/)"
)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_owners(
    packages: Sequence[str] = ("onnxruntime", "worker"),
) -> dict[str, list[tuple[str, str]]]:
    """The installed distributions that provide each import package, from their metadata
    (top_level.txt or RECORD). Scans every installed distribution: call once, at start-up."""
    found = importlib.metadata.packages_distributions()
    owners: dict[str, list[tuple[str, str]]] = {}
    for package in packages:
        names = sorted({_canonical(n) for n in found.get(package, [])})
        owners[package] = [(n, importlib.metadata.version(n)) for n in names]
    return owners


def runtime_distribution(owners: Owners | None = None) -> tuple[str, str] | None:
    """(name, version) of the one distribution that provides ``onnxruntime``, e.g.
    ``("onnxruntime-gpu", "1.26.0")``; None when none or several do."""
    found = (installed_owners() if owners is None else owners).get("onnxruntime", ())
    return found[0] if len(found) == 1 else None


def _both(found: Sequence[tuple[str, str]], package: str) -> str:
    listed = " and ".join(f"{name} {version}" for name, version in found)
    every = "both" if len(found) == 2 else "all"
    return f"{listed} are {every} installed and write the same {package!r} package"


def runtime_problem(owners: Owners | None = None, python: str = sys.executable) -> str | None:
    """None when ``onnxruntime`` and ``worker`` each come from one distribution; otherwise
    what clashes and the pip commands (for this interpreter) that leave one."""
    owners = installed_owners() if owners is None else owners
    pip = f"{python} -m pip"
    runtimes = dict(owners.get("onnxruntime", ()))
    workers = dict(owners.get("worker", ()))
    problems: list[str] = []
    if len(workers) > 1:
        keep = GPU_DISTRIBUTION if GPU_RUNTIME in runtimes else CPU_DISTRIBUTION
        version = workers.get(keep) or next(iter(workers.values()))
        problems.append(
            f"{_both(list(workers.items()), 'worker')}. Keep one:\n"
            f"  {pip} uninstall -y {' '.join(workers)}\n"
            f"  {pip} install {keep}=={version}"
            + (f"  {_FROM_CHECKOUT}" if keep == GPU_DISTRIBUTION else "")
        )
    if len(runtimes) > 1:
        problems.append(_runtime_clash(runtimes, workers, pip))
    return "\n".join(problems) or None


def _runtime_clash(runtimes: dict[str, str], workers: dict[str, str], pip: str) -> str:
    found = list(runtimes.items())
    if GPU_RUNTIME not in runtimes:
        keep = next((n for n in runtimes if n != CPU_RUNTIME), found[0][0])
        others = " ".join(n for n in runtimes if n != keep)
        return (
            f"{_both(found, 'onnxruntime')}: the files are those of the last installed. "
            f"Keep one, e.g. {keep}:\n"
            f"  {pip} uninstall -y {others}\n"
            f"  {pip} install --force-reinstall --no-deps {keep}=={runtimes[keep]}"
        )
    others = " ".join(n for n in runtimes if n != GPU_RUNTIME)
    lines = [
        f"{_both(found, 'onnxruntime')}: the files are those of the last installed, so the "
        f"CUDA and TensorRT providers are there only if that was {GPU_RUNTIME}.",
        "For the GPU runtime, run:",
    ]
    if CPU_DISTRIBUTION in workers:  # streamfer requires onnxruntime: switch to streamfer-gpu
        lines.append(f"  {pip} uninstall -y {CPU_DISTRIBUTION} {others}")
    else:
        lines.append(f"  {pip} uninstall -y {others}")
    lines.append(
        f"  {pip} install --force-reinstall --no-deps {GPU_RUNTIME}=={runtimes[GPU_RUNTIME]}"
    )
    if CPU_DISTRIBUTION in workers:
        lines.append(
            f"  {pip} install {GPU_DISTRIBUTION}=={workers[CPU_DISTRIBUTION]}  {_FROM_CHECKOUT}"
        )
    if GPU_DISTRIBUTION not in workers and CPU_RUNTIME in runtimes:
        lines += [
            "For the CPU runtime only, run:",
            f"  {pip} uninstall -y {' '.join(n for n in runtimes if n != CPU_RUNTIME)}",
            f"  {pip} install --force-reinstall --no-deps {CPU_RUNTIME}=={runtimes[CPU_RUNTIME]}",
        ]
    return "\n".join(lines)


def gpu_install_hint(owners: Owners | None = None, python: str = sys.executable) -> str:
    """What to run to get the CUDA and TensorRT providers, for a message that says they
    are missing: they come with onnxruntime-gpu, which streamfer-gpu requires."""
    owners = installed_owners() if owners is None else owners
    runtimes = dict(owners.get("onnxruntime", ()))
    workers = dict(owners.get("worker", ()))
    pip = f"{python} -m pip"
    if len(runtimes) > 1:
        return runtime_problem(owners, python) or ""
    if GPU_RUNTIME in runtimes:
        return (
            f"{GPU_RUNTIME} {runtimes[GPU_RUNTIME]} is installed, so the provider's own "
            "libraries (CUDA, cuDNN or TensorRT) are missing or do not match it"
        )
    if CPU_DISTRIBUTION not in workers:  # a checkout on the path, or streamfer-gpu --no-deps
        return (
            f"the GPU providers come with {GPU_RUNTIME}, in place of {CPU_RUNTIME}:\n"
            + (f"  {pip} uninstall -y {' '.join(runtimes)}\n" if runtimes else "")
            + f"  {pip} install {GPU_RUNTIME}"
        )
    remove = " ".join([CPU_DISTRIBUTION, *runtimes])
    return (
        f"the GPU providers come with {GPU_RUNTIME}: install {GPU_DISTRIBUTION} in place of "
        f"{CPU_DISTRIBUTION}:\n"
        f"  {pip} uninstall -y {remove}\n"
        f"  {pip} install {GPU_DISTRIBUTION}=={workers[CPU_DISTRIBUTION]}  {_FROM_CHECKOUT}"
    )
