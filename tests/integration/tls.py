"""Certificates for the TLS tests: a private CA, a server certificate for 127.0.0.1 and
client certificates, PEM files made with the openssl command line."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certificates:
    ca: Path
    ca_key: Path
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    assert openssl is not None, "the TLS tests need the openssl command (Debian: openssl)"
    subprocess.run([openssl, *args], check=True, capture_output=True)


def make_certificates(directory: Path, name: str = "server") -> Certificates:
    """A CA and a certificate it signed for ``127.0.0.1`` and ``localhost``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
             "-out", str(ca), "-days", "2", "-subj", "/CN=streamfer-test-ca")  # fmt: skip
    cert, key = sign(directory, ca, ca_key, name, san="IP:127.0.0.1,DNS:localhost")
    return Certificates(ca, ca_key, cert, key)


def sign(
    directory: Path, ca: Path, ca_key: Path, name: str, san: str | None = None
) -> tuple[Path, Path]:
    """A key and a certificate for ``name`` (its CN) signed by the CA."""
    cert, key, csr = directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.csr"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
             "-subj", f"/CN={name if san is None else '127.0.0.1'}")  # fmt: skip
    ext = []
    if san is not None:
        ext_file = directory / f"{name}.ext"
        ext_file.write_text(f"subjectAltName={san}\n")
        ext = ["-extfile", str(ext_file)]
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(cert), "-days", "2", *ext)  # fmt: skip
    return cert, key
