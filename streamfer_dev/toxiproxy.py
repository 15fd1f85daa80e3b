"""Toxiproxy, a TCP fault proxy, for the fault harness's network faults.

Toxiproxy (Shopify) sits between a client and a server and, on command over its HTTP
API, adds latency, limits bandwidth, slices packets, black-holes or resets connections,
or refuses them altogether. It is a Go program: ``toxiproxy_binary`` builds it once with
``go install`` into the tool cache (``STREAMFER_CACHE``, as the Kafka jars are), so a
machine needs Go and the Go module proxy only the first time. The server binds its API to
127.0.0.1 on a free port and is stopped by its PID; ``Toxiproxy`` is a small client of
that API on the standard library.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from streamfer_dev.stack import Service, cache_dir, start_owned
from worker.errors import StackError

__all__ = [
    "TOXIPROXY_MODULE",
    "TOXIPROXY_VERSION",
    "Toxic",
    "Toxiproxy",
    "start_toxiproxy",
    "toxiproxy_binary",
]

TOXIPROXY_VERSION = "2.12.0"
TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"

Stream = Literal["upstream", "downstream"]


def toxiproxy_binary(version: str = TOXIPROXY_VERSION) -> Path:
    """The toxiproxy server, built with ``go install`` into the cache on first use.

    Raises ``StackError`` when Go is missing or the build fails (its output in the
    message). Two builds at once are harmless: each builds in a directory of its own and
    the last rename wins."""
    binary = cache_dir() / f"toxiproxy-{version}" / "toxiproxy-server"
    if binary.exists():
        return binary
    go = shutil.which("go")
    if go is None:
        raise StackError("toxiproxy is built from source with Go ('go' not found); install golang")
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=binary.parent) as tmp:
        env = {**os.environ, "GOBIN": tmp, "CGO_ENABLED": "0"}
        built = subprocess.run(
            [go, "install", f"{TOXIPROXY_MODULE}@v{version}"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp,  # outside any module, so go.mod files around us do not matter
            check=False,
        )
        if built.returncode != 0:
            raise StackError(f"go install toxiproxy {version} failed:\n{built.stderr[-2000:]}")
        os.replace(Path(tmp) / "server", binary)
    return binary


@dataclass(frozen=True)
class Toxic:
    """One toxic as the API takes it: ``kind`` is toxiproxy's type (``latency``,
    ``bandwidth``, ``slicer``, ``timeout``, ``reset_peer`` ...), ``attributes`` its
    settings (milliseconds, KB/s, bytes, microseconds: see toxiproxy's README)."""

    name: str
    kind: str
    attributes: dict[str, int] = field(default_factory=dict)
    stream: Stream = "downstream"

    def body(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.kind,
            "stream": self.stream,
            "toxicity": 1.0,
            "attributes": self.attributes,
        }


@dataclass
class Toxiproxy:
    """A running toxiproxy server and its API. Every call raises ``StackError`` when the
    API refuses it."""

    service: Service

    @property
    def api(self) -> str:
        return f"http://{self.service.address}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else orjson.dumps(body)
        request = urllib.request.Request(f"{self.api}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
        except OSError as exc:  # HTTPError and URLError are OSErrors
            detail = exc.read().decode(errors="replace") if hasattr(exc, "read") else ""
            raise StackError(f"toxiproxy {method} {path}: {exc} {detail}") from exc
        return orjson.loads(text) if text else None

    def create(self, name: str, listen_port: int, upstream: str) -> str:
        """A proxy from 127.0.0.1:``listen_port`` to ``upstream``; returns its address."""
        listen = f"127.0.0.1:{listen_port}"
        self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream})
        return listen

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        """Disabled, the proxy closes its connections and refuses new ones (a server down)."""
        self._call("POST", f"/proxies/{proxy}", {"enabled": enabled})

    def add(self, proxy: str, toxic: Toxic) -> None:
        self._call("POST", f"/proxies/{proxy}/toxics", toxic.body())

    def remove(self, proxy: str, toxic: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{toxic}")

    def reset(self) -> None:
        """Every proxy enabled again, every toxic removed."""
        self._call("POST", "/reset")

    def stop(self) -> None:
        self.service.stop()


def start_toxiproxy(*, port: int | None = None, timeout: float = 20.0) -> Toxiproxy:
    """A toxiproxy server with its API on 127.0.0.1 (building it first if need be)."""
    binary = str(toxiproxy_binary())
    service = start_owned(
        "toxiproxy",
        lambda p, _work: [binary, "-host", "127.0.0.1", "-port", str(p)],
        lambda p: f"127.0.0.1:{p}",
        port,
        timeout,
    )
    return Toxiproxy(service)
