"""A broker's disk of its own: filled to the last byte, freed, and never the real disk."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamfer_dev import small_disk
from worker.errors import StackError


def test_a_folder_on_the_real_disk_is_never_filled(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="not a tmpfs of its own"):
        small_disk.fill(tmp_path)
    assert not (tmp_path / small_disk.FILLER).exists()


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path = tmp_path / "disk"
    small_disk.mount(path, 4)
    yield path
    small_disk.unmount(path)
    assert str(path) not in Path("/proc/self/mounts").read_text()


def test_a_filled_disk_takes_no_write_until_freed(disk: Path) -> None:
    (disk / "segment.log").write_bytes(b"x" * 10_000)

    taken = small_disk.fill(disk)

    assert 4 * 2**20 - 20_000 < taken <= 4 * 2**20
    assert os.statvfs(disk).f_bavail == 0
    fd = os.open(disk / "next.log", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError) as refused:
            os.write(fd, b"record")
        assert refused.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    small_disk.free(disk)
    assert os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize > 4 * 2**20 - 20_000
    assert (disk / "segment.log").read_bytes() == b"x" * 10_000
