"""The soak's chart: one PNG of four panels over the minutes, events as vertical lines.

Latency (p50 and p99 per minute, log scale), each worker's RSS, each worker's CPU
seconds per minute, and requests produced against results read per minute; every
broker restart and the Redis failover is a line across all four.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["draw"]


def draw(report: dict[str, Any], path: Path) -> None:
    """Write ``report``'s chart (``benchmarks.soak``'s JSON) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # no display here
    import matplotlib.pyplot as plt

    rows = report["rows"]
    minutes = [r["minute"] + 0.5 for r in rows]  # a row covers its minute
    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    lat, rss, cpu, flow = axes
    lat.plot(minutes, [r["p50_ms"] for r in rows], label="p50")
    lat.plot(minutes, [r["p99_ms"] for r in rows], label="p99")
    lat.set_yscale("log")
    lat.set_ylabel("request to result, ms")
    workers = sorted({name for r in rows for name in r["rss_mb"]})
    for name in workers:
        rss.plot(minutes, [r["rss_mb"].get(name) for r in rows], label=name)
        cpu.plot(minutes, [r["cpu_s"].get(name) for r in rows], label=name)
    rss.set_ylabel("RSS, MiB")
    cpu.set_ylabel("CPU s per minute")
    flow.plot(minutes, [r["produced"] for r in rows], label="produced")
    flow.plot(minutes, [r["results"] for r in rows], label="results")
    flow.set_ylabel("per minute")
    flow.set_xlabel("minute")
    for event in report["events"]:
        at = event["at_s"] / 60
        colour = "tab:red" if "redis" in event["what"] else "tab:grey"
        for ax in axes:
            ax.axvline(at, color=colour, linestyle="--", linewidth=0.8)
        lat.annotate(
            event["what"],
            (at, 1),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
        )
    for ax in axes:
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"soak: {report['mode']}, {report['rate']:.0f} requests/s, {report['minutes']} minutes"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
