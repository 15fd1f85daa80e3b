"""Turning a benchmark report into ratios and a plain-text table.

``ratios`` compares streamfer's records/s with each baseline's and ceiling's (and p99
latency the other way), and two workers' (``streamfer_2w``, ``streamfer_2p``) with one's;
``format_table`` prints the report as ``python -m benchmarks.run`` shows it: a header
naming the model, load, settings, commit and machine load, one row per contender, the
ratios (over several rounds, each round's too), ONNX Runtime's rows/s by batch size, any
log tail of a contender that failed, and the top py-spy frames when sampled.
"""

from __future__ import annotations

from typing import Any

from benchmarks.rounds import rounds_text

__all__ = ["format_table", "latency_targets", "ratios"]


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """streamfer's records/s over each baseline's and ceiling's; p99 latency the other way.

    In steady mode every contender that keeps up shows the offered rate, so there the
    records/s ratios only tell who fell behind, and the p99 ratios are the comparison.
    """

    def rps(name: str) -> float | None:
        value = results.get(name, {}).get("rps")
        return float(value) if value else None

    def over(a: float | None, b: float | None) -> float | None:
        if not a or not b:
            return None
        return round(a / b, 2 if a >= b / 10 else 4)

    def p99(name: str) -> float | None:
        value = results.get(name, {}).get("p99_ms")
        return float(value) if value else None

    def cpu(name: str) -> float | None:
        value = results.get(name, {}).get("cpu_s_per_10k")
        return float(value) if value else None

    sf = rps("streamfer")
    ceilings = {c: rps(c) for c in ("passthrough", "redis_alone", "ort_alone") if rps(c)}
    slowest = min(ceilings, key=lambda c: ceilings[c] or 0.0) if ceilings else None
    return {
        "streamfer_vs_faust": over(sf, rps("faust")),
        "streamfer_vs_naive": over(sf, rps("naive")),
        "streamfer_vs_batch_loop": over(sf, rps("batch_loop")),
        "streamfer_vs_slowest_ceiling": over(sf, ceilings[slowest]) if slowest else None,
        "slowest_ceiling": slowest,
        "streamfer_vs_ort_alone": over(sf, rps("ort_alone")),
        "streamfer_2w_vs_streamfer": over(rps("streamfer_2w"), sf),
        "streamfer_2p_vs_streamfer": over(rps("streamfer_2p"), sf),
        "streamfer_2p_vs_streamfer_2w": over(rps("streamfer_2p"), rps("streamfer_2w")),
        "streamfer_cache_vs_streamfer": over(rps("streamfer_cache"), sf),
        "streamfer_share_vs_streamfer": over(rps("streamfer_share"), sf),
        "streamfer_share_2w_vs_streamfer_2w": over(rps("streamfer_share_2w"), rps("streamfer_2w")),
        "streamfer_share_2w_vs_streamfer_share": over(
            rps("streamfer_share_2w"), rps("streamfer_share")
        ),
        "streamfer_vs_baseline": over(sf, rps("streamfer_baseline")),
        "cpu_per_10k_streamfer_over_baseline": over(cpu("streamfer"), cpu("streamfer_baseline")),
        "cpu_per_10k_streamfer_over_batch_loop": over(cpu("streamfer"), cpu("batch_loop")),
        "p99_faust_over_streamfer": over(p99("faust"), p99("streamfer")),
        "p99_naive_over_streamfer": over(p99("naive"), p99("streamfer")),
    }


def latency_targets(
    results: dict[str, dict[str, Any]], ort_by_batch: list[dict[str, Any]], max_wait_ms: float
) -> dict[str, Any] | None:
    """The steady-mode latency targets of issue 4, from figures of the same run.

    Under load: streamfer's p99 <= the passthrough's p99 + ``max_wait_ms`` + 3 x the
    model's time for one batch (ONNX Runtime alone, at the measured batch size nearest the
    one in use) + 10 ms. A lone request at idle (a low ``--rate``): streamfer's
    p50 <= the passthrough's p50 + the model's single-row time + 5 ms.
    """
    sf, pt, ort = results.get("streamfer"), results.get("passthrough"), results.get("ort_alone")
    if not sf or not pt or not ort or not ort_by_batch or sf.get("p99_ms") is None:
        return None
    one = next((s for s in ort_by_batch if s["batch"] == 1), None)
    if one is None or pt.get("p99_ms") is None:
        return None
    p99_limit = pt["p99_ms"] + max_wait_ms + 3 * ort["p50_ms"] + 10.0
    lone_limit = pt["p50_ms"] + one["p50_ms"] + 5.0
    return {
        "p99_limit_ms": round(p99_limit, 1),
        "p99_ms": sf["p99_ms"],
        "p99_met": sf["p99_ms"] <= p99_limit,
        "lone_p50_limit_ms": round(lone_limit, 1),
        "p50_ms": sf["p50_ms"],
        "lone_p50_met": sf["p50_ms"] <= lone_limit,
    }


def _fmt(value: Any, spec: str = ",.0f") -> str:
    if value is None:
        return "-"
    return format(value, spec)


def _warmup_text(warmup: dict[str, Any] | None) -> str:
    if not warmup:
        return ""
    if warmup.get("error"):
        return f", broker warm-up failed ({warmup['error']})"
    return f", warmed with {warmup['records']:,} passthrough records"


def format_table(report: dict[str, Any]) -> str:
    """The report as a plain-text table with notes."""
    lines = [
        f"streamfer benchmark, {report['date']}, commit {report['commit']}"
        + (" (worker/ modified)" if report["worktree_dirty"] else "")
        + (f"; streamfer_baseline is {report['baseline']}" if report.get("baseline") else ""),
        f"model {report['model']}: {report['model_text']}; mode {report['mode']}"
        + (f" at {report['rate']:,.0f} records/s" if report["rate"] else "")
        + f"; {report['records']:,} records; {report['partitions']} partitions;"
        f" features {report['layout']}; batch {report['batch_mode']}"
        f" <= {report['max_batch_size']}, wait <= {report['max_wait_ms']:g} ms"
        + (
            f", in flight <= {report['max_in_flight_batches']}"
            if report["max_in_flight_batches"]
            else ""
        )
        + ("" if report.get("source_headers", True) else ", no source headers")
        + (
            f", {report['repeat_share']:.0%} of requests repeat {report['distinct']:,} inputs"
            if report.get("repeat_share") is not None
            else ""
        )
        + ";"
        f" {report['broker']}"
        + _warmup_text(report.get("broker_warmup"))
        + f"; {report['cpus']} CPUs, load average"
        f" {report['loadavg_1m'][0]:.1f} at start, {report['loadavg_1m'][1]:.1f} at end",
        "",
    ]
    width = max([16, *(len(name) + 2 for name in report["results"])])
    head = (
        f"{'contender':<{width}}{'records':>8}{'records/s':>11}{'p50 ms':>9}{'p95 ms':>9}"
        f"{'p99 ms':>9}{'CPU s/10k':>10}{'RSS MB':>8}{'lost':>6}{'dup':>5}  note"
    )
    lines += [head, "-" * len(head)]
    for name, r in report["results"].items():
        note = r.get("note", "")
        if name in ("ort_alone", "redis_alone"):
            note = f"in-process, batches of {r['batch']}; latency per batch"
            if "with_assemble_rps" in r:
                note += f"; with assemble {r['with_assemble_rps']:,.0f}/s"
            if "rps_before" in r:
                note += (
                    f"; the faster of {r['rps_before']:,.0f}/s before the Kafka contenders"
                    f" and {r['rps_after']:,.0f}/s after"
                )
        if r.get("first_5s_p99_ms") is not None:
            note = f"{note}; first 5 s p99 {r['first_5s_p99_ms']:,.1f} ms".strip("; ")
        if r.get("cached"):
            note = f"{note}; {r['cached']:,} results from the cache".strip("; ")
        if r.get("error"):
            note = f"{note}; {r['error']}".strip("; ")
        lines.append(
            f"{name:<{width}}{_fmt(r.get('records'), ',d'):>8}{_fmt(r['rps']):>11}"
            f"{_fmt(r['p50_ms'], ',.1f'):>9}{_fmt(r.get('p95_ms'), ',.1f'):>9}"
            f"{_fmt(r['p99_ms'], ',.1f'):>9}{_fmt(r.get('cpu_s_per_10k'), '.2f'):>10}"
            f"{_fmt(r.get('rss_mb'), ',.0f'):>8}{_fmt(r['lost'], 'd'):>6}"
            f"{_fmt(r.get('duplicates'), 'd'):>5}  {note}"
        )
    ratio_text = ", ".join(
        f"{k} {v}" + ("x" if isinstance(v, float) else "")
        for k, v in report["ratios"].items()
        if v is not None
    )
    lines += ["", f"ratios: {ratio_text or '-'}"]
    if report.get("rounds"):
        lines.append(
            f"ratios round by round ({report['rounds']['count']} rounds, order alternating):"
        )
        lines += rounds_text(report["rounds"]["ratios"])
    targets = report.get("latency_targets")
    if targets:
        lines.append(
            f"latency targets: under load p99 {targets['p99_ms']:,.1f} ms vs limit"
            f" {targets['p99_limit_ms']:,.1f} ms ({'met' if targets['p99_met'] else 'not met'});"
            f" lone request p50 {targets['p50_ms']:,.1f} ms vs limit"
            f" {targets['lone_p50_limit_ms']:,.1f} ms"
            f" ({'met' if targets['lone_p50_met'] else 'not met'})"
        )
    if "ort_by_batch" in report:
        lines.append(
            "ORT alone, rows/s by batch size: "
            + ", ".join(f"{s['batch']}: {s['rps']:,.0f}" for s in report["ort_by_batch"])
        )
    lines.append(
        "latency = result Kafka timestamp - request produce timestamp"
        + (
            "; in backlog mode it includes time queued before the contender started"
            if report["mode"] == "backlog"
            else ""
        )
        + (
            f"; requests of the first {report['warmup_s']:g} s are left out of latency and CPU"
            if report.get("warmup_s")
            else ""
        )
        + "; CPU s/10k counts the contender's processes from the first result"
        + (" of a request made after them" if report.get("warmup_s") else "")
        + " to the last"
    )
    for name, r in report["results"].items():
        if r.get("log_tail"):
            lines.append(f"\n{name} log tail:\n{r['log_tail']}")
    for name, per_pid in report.get("profiles", {}).items():
        for label, frames in per_pid.items():
            lines.append(f"\npy-spy {label} ({name}), top self frames:")
            lines += [f"  {pct:5.1f}%  {frame}" for frame, pct in frames["self"][:12]]
            lines.append("  top inclusive frames:")
            lines += [f"  {pct:5.1f}%  {frame}" for frame, pct in frames["inclusive"][:12]]
    return "\n".join(lines)
