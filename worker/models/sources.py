"""Where a model's next version is: the newest file of its source now (``newest``: the
highest version of a directory of versions, or the model file itself), and that file as
``stat`` sees it (``Fingerprint``), cheap to take at every poll. The reloader looks at a
single model's source and at each step of a graph through these."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from worker.config import ModelSpec, list_versions

__all__ = ["Fingerprint", "fingerprint", "newest"]


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A candidate as ``stat`` sees it: cheap to take at every poll."""

    version: str
    path: Path
    inode: int
    size: int
    mtime_ns: int


def fingerprint(version: str, path: Path) -> Fingerprint | None:
    """``path`` as ``stat`` sees it now; None when it is not there."""
    try:
        st = path.stat()
    except OSError:
        return None
    return Fingerprint(version, path, st.st_ino, st.st_size, st.st_mtime_ns)


def newest(spec: ModelSpec) -> tuple[str, Path] | None:
    """The version and file of ``spec``'s newest model now: its directory's highest
    version (None while it has none), or its file."""
    if spec.version_dir is None:
        return spec.version, spec.file
    versions = list_versions(spec.version_dir)
    return (versions[-1].name, versions[-1].path) if versions else None
