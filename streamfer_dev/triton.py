"""A real Triton Inference Server for the tests and benchmarks, from a package index.

The ``nvidia-pytriton`` wheel bundles the ``tritonserver`` binary and its Python
backend. The backend's stub embeds the shared ``libpython`` of the interpreter's exact
version, so the server runs under Debian's ``/usr/bin/python3`` (built with
``--enable-shared``; the ``libpython3.11`` package) in a venv of its own, made once in
the tool cache (``STREAMFER_CACHE``) and reused; a Python built without its shared
library (pyenv's, say) fails there, and so does one whose libpython is another patch
level. ``server_python`` says why when it cannot be made, so tests can skip with the
reason. The server itself runs ``triton_serve.py`` (ONNX files through ONNX Runtime in a
bound function, dynamic batching, CPU) on free ports of 127.0.0.1 and is stopped by its
PID (its process group: PyTriton's own children go with it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from streamfer_dev.stack import cache_dir, free_port
from worker.errors import StackError

__all__ = ["PYTRITON_VERSION", "TritonServer", "server_python", "start_triton"]

PYTRITON_VERSION = "0.7.0"
_PACKAGES = (f"nvidia-pytriton=={PYTRITON_VERSION}", "onnxruntime==1.32.0")
"""The server's venv: PyTriton, and the same ONNX Runtime the worker's tests pin, so a
model scores the same on either side."""
SYSTEM_PYTHON = Path(os.environ.get("STREAMFER_TRITON_PYTHON", "/usr/bin/python3"))
_SERVE = Path(__file__).with_name("triton_serve.py")


def _shared_libpython(python: Path) -> str | None:
    """Why ``python`` cannot host the Python backend's stub, or None when it can."""
    probe = (
        "import sys, sysconfig, pathlib; "
        "lib = pathlib.Path(sysconfig.get_config_var('LIBDIR') or '') / "
        "(sysconfig.get_config_var('LDLIBRARY') or ''); "
        "ok = sysconfig.get_config_var('Py_ENABLE_SHARED') and lib.is_file(); "
        "sys.exit(0 if ok else 3)"
    )
    found = subprocess.run([str(python), "-c", probe], capture_output=True, check=False)
    if found.returncode != 0:
        return f"{python} has no shared libpython (Debian: apt-get install libpython3-dev)"
    return None


def server_python() -> Path:
    """The interpreter of the server's venv, made on first use (about 20 s from pip's
    cache, a minute or two downloading the 55 MB wheel). Raises ``StackError`` saying
    why the server cannot run here."""
    venv = cache_dir() / f"pytriton-{PYTRITON_VERSION}"
    python = venv / "bin" / "python"
    if (venv / ".complete").exists():
        return python
    if not SYSTEM_PYTHON.exists():
        raise StackError(f"Triton needs {SYSTEM_PYTHON} (Debian's python3 with libpython3.11)")
    why = _shared_libpython(SYSTEM_PYTHON)
    if why is not None:
        raise StackError(why)
    if sys.platform != "linux":
        raise StackError("the tritonserver in nvidia-pytriton runs on Linux x86-64 only")
    started = time.monotonic()
    building = Path(tempfile.mkdtemp(prefix=venv.name + ".", dir=cache_dir()))
    try:
        made = subprocess.run(
            [str(SYSTEM_PYTHON), "-m", "venv", str(building)], capture_output=True, check=False
        )
        if made.returncode != 0:
            raise StackError(f"cannot make a venv with {SYSTEM_PYTHON} (Debian: python3-venv)")
        pip = [str(building / "bin" / "python"), "-m", "pip", "install", "-q", *_PACKAGES]
        installed = subprocess.run(pip, capture_output=True, text=True, check=False)
        if installed.returncode != 0:
            raise StackError(f"cannot install {_PACKAGES}:\n{installed.stderr[-2000:]}")
        (building / ".complete").touch()
        # moved whole into place (only its scripts' shebangs name the old path, and the
        # server is started as ``python triton_serve.py``); a half-made one never is
        shutil.rmtree(venv, ignore_errors=True)
        building.rename(venv)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    print(f"streamfer: Triton's venv made in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return python


@dataclass
class TritonServer:
    """A running server: its gRPC address, the models it serves, how to stop it."""

    grpc_port: int
    models: list[str]
    """``NAME:VERSION:PATH`` of each model it serves."""
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    refuse_above: float | None = None
    ports: tuple[int, int] = field(default=(0, 0))
    """HTTP and metrics ports."""

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``timeout``; removes its
        scratch folder."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        # PyTriton's server and backend stubs, should any outlive it
        _kill_group(process.pid)
        if self.log_path is not None:  # its scratch folder, log included
            shutil.rmtree(self.log_path.parent, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def start_triton(
    models: list[str],
    *,
    grpc_port: int | None = None,
    refuse_above: float | None = None,
    max_batch_size: int = 256,
    instances: int = 1,
    timeout: float = 120.0,
) -> TritonServer:
    """A server of ``models`` (``NAME:VERSION:PATH``), ready once every model answers
    readiness; on ``grpc_port`` when given (a restart keeps its address); ``instances``
    of each model serve calls side by side."""
    python = server_python()
    server = TritonServer(
        grpc_port or free_port(),
        models,
        refuse_above=refuse_above,
        ports=(free_port(), free_port()),
    )
    work = Path(tempfile.mkdtemp(prefix="streamfer-triton-"))
    server.log_path = work / "triton.log"
    argv = [
        str(python),
        str(_SERVE),
        "--grpc-port",
        str(server.grpc_port),
        "--http-port",
        str(server.ports[0]),
        "--metrics-port",
        str(server.ports[1]),
        "--max-batch-size",
        str(max_batch_size),
        "--instances",
        str(instances),
        *(a for m in models for a in ("--model", m)),
        *(["--refuse-above", str(refuse_above)] if refuse_above is not None else []),
    ]
    env = {**os.environ, "HOME": str(work), "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    with server.log_path.open("ab") as log_file:
        server.process = subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=work,
            env=env,
        )
    try:
        _wait_ready(server, timeout)
    except BaseException:
        server.stop()
        raise
    return server


def _answers_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):  # not listening yet, or 400: not ready
        return False


def _wait_ready(server: TritonServer, timeout: float) -> None:
    """Until every model answers ready on the server's HTTP endpoint (KServe v2's
    ``/v2/models/NAME/versions/V/ready``): plain HTTP, so the dev package needs no
    Triton client of its own."""
    http = server.ports[0]
    urls = [
        f"http://127.0.0.1:{http}/v2/models/{name}/versions/{version}/ready"
        for name, version in (m.split(":", 2)[:2] for m in server.models)
    ]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.process is not None
        if server.process.poll() is not None:
            raise StackError(f"tritonserver exited:\n{server.log_tail()}")
        if all(_answers_ready(url) for url in urls):
            return
        time.sleep(0.3)
    raise StackError(
        f"Triton did not serve {server.models} in {timeout:.0f}s:\n{server.log_tail()}"
    )
