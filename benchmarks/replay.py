"""Replay throughput: a backlog of requests (1% malformed) replayed by ``streamfer
replay`` over its whole range, on a local broker and Redis, unthrottled, at ``--nice
0``, with the light or the heavy benchmark model. Prints records/s per run, as the
replay's own summary measured it, and the median. ``--code DIR`` runs another
checkout's ``worker`` package (a before/after comparison on one stack)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

import orjson

from benchmarks.chaos import Env
from benchmarks.models import MODEL_NAMES, make_model
from streamfer_dev.harness import produce_requests, worker_config_toml
from worker.kafka import ensure_topics

PARTITIONS = 4


def replay_once(env: Env, config: Path, state: Path, code: Path | None) -> dict[str, object]:
    environ = dict(os.environ)
    if code is not None:
        environ["PYTHONPATH"] = str(code)
    argv = [sys.executable, "-m", "worker", "replay", "--config", str(config)]
    argv += ["--state-dir", str(state), "--nice", "0", "--json", "--replay-id", uuid.uuid4().hex]
    proc = subprocess.run(argv, capture_output=True, text=True, env=environ, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"replay failed ({proc.returncode}): {proc.stderr[-2000:]}")
    summary: dict[str, object] = orjson.loads(proc.stdout.strip().splitlines()[-1])
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", choices=["light", "heavy"], default="light")
    parser.add_argument("--code", type=Path, action="append", default=[], help="a checkout")
    args = parser.parse_args(argv)
    codes: list[Path | None] = list(args.code) or [None]
    with Env.start() as env:
        tag = uuid.uuid4().hex[:6]
        topics = (f"rb-req-{tag}", f"rb-res-{tag}", f"rb-dlq-{tag}")
        ensure_topics(env.bootstrap, [(t, PARTITIONS) for t in topics])
        requests = []
        for i in range(args.records):
            entity = env.entities[i % len(env.entities)]
            value = b"{" if i % 100 == 99 else orjson.dumps({"id": f"r{i}", "entity": entity})
            requests.append((f"r{i}", entity.encode(), value))
        produce_requests(env.bootstrap, topics[0], requests)
        model = make_model(args.model, env.work)
        config = env.work / "replay.toml"
        config.write_text(
            worker_config_toml(
                bootstrap=env.bootstrap,
                redis_url=env.redis.address,
                group=f"rb-{tag}",
                request_topic=topics[0],
                result_topic=topics[1],
                dead_letter_topic=topics[2],
                model_path=model.path,
                fields=model.fields,
                model_name=MODEL_NAMES[args.model],
            )
        )
        # unmeasured: a fresh broker loads its code and group coordinator on first use
        replay_once(env, config, env.work / "state", None)
        rates: dict[str, list[float]] = {str(c or "this checkout"): [] for c in codes}
        for run in range(args.runs):
            for code in codes:  # interleaved, so drift in the machine's speed hits all alike
                summary = replay_once(env, config, env.work / "state", code)
                name = str(code or "this checkout")
                rate = float(summary["rate_rps"])  # type: ignore[arg-type]
                rates[name].append(rate)
                print(
                    f"run {run + 1} {name}: {summary['records']} records, {summary['results']} "
                    f"results, {summary['dead_letters']} dead letters, lost {summary['lost']}, "
                    f"{summary['elapsed_s']} s, {rate:,.0f} records/s",
                    flush=True,
                )
        for name, values in rates.items():
            print(f"{name}: median {statistics.median(values):,.0f} records/s over {len(values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
