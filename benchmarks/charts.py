"""The latency charts' common frame: matplotlib without a display, a log latency axis,
the legend and grid, written as a PNG (matplotlib is in the ``bench`` extra)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["latency_chart"]


@contextmanager
def latency_chart(path: Path, title: str, xlabel: str, ylabel: str) -> Iterator[Any]:
    """The axes to draw on; on exit, titled, labelled and saved to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        yield ax
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize="small")
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
