"""Deployment artifacts: Dockerfile, compose stack, Helm chart, alerts and dashboard.

The Python-only checks always run: YAML and JSON parse, the compose file against the
compose-spec JSON Schema (vendored in ``schemas/``), the worker configuration each
deployment builds validated by ``worker.config``, and every metric and label that the
alerts and the dashboard query is one the worker exports (``worker.ops.metrics``).

Checks that need a binary (``helm``, ``promtool``) use it from PATH or ``.tools/bin`` and
otherwise skip, saying so; ``scripts/deploy-tools.sh`` builds both from source.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import promql_parser
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tests.deploy.dockerfiles import CPU, DOCKERFILES, GPU, gpu_dist, instructions, stages
from worker.compose import Metrics
from worker.config import WorkerConfig, parse_config
from worker.ops import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
ALERTS = ROOT / "ops" / "prometheus" / "alerts.yml"
ALERT_TESTS = ROOT / "ops" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "streamfer-dashboard.json"
CHART = ROOT / "ops" / "helm" / "streamfer"

# Labels Prometheus attaches to every scraped series (compose: job, instance; Kubernetes
# via a ServiceMonitor: also namespace, pod, service, container, endpoint).
TARGET_LABELS = frozenset(
    {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}
)
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


# --------------------------------------------------------------------------- helpers


@functools.cache
def exported_families() -> dict[str, tuple[str, frozenset[str]]]:
    """Every family a worker exports: sample name (as in METRIC_NAMES) -> (type, labels)."""
    metrics = Metrics()
    families: dict[str, tuple[str, frozenset[str]]] = {}
    for metric in vars(metrics).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        # prometheus_client keeps a metric's label names in ``_labelnames``.
        labels = frozenset(metric._labelnames)
        name, kind = metric._name, metric._type
        families[f"{name}_total" if kind == "counter" else name] = (kind, labels)
    return families


@functools.cache
def allowed_series() -> dict[str, frozenset[str]]:
    """Series names a query may select (histograms as _bucket/_sum/_count) -> labels."""
    allowed: dict[str, frozenset[str]] = {}
    for name in METRIC_NAMES:
        kind, labels = exported_families()[name]
        if kind == "histogram":
            allowed[f"{name}_bucket"] = labels | {"le"}
            for suffix in HISTOGRAM_SUFFIXES[1:]:
                allowed[f"{name}{suffix}"] = labels
        else:
            allowed[name] = labels
    return allowed


def promql_references(expr: str) -> tuple[set[str], set[str]]:
    """Metric names selected and label names used anywhere in a PromQL expression."""
    ast = promql_parser.parse(expr)
    names: set[str] = set()
    labels: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = list(node.matchers.matchers)
            for group in node.matchers.or_matchers or []:
                matchers += list(group)
            named = [m.value for m in matchers if m.name == "__name__"]
            assert node.name or named, f"selector without a metric name in {expr!r}"
            names.update([node.name] if node.name else named)
            labels.update(m.name for m in matchers if m.name != "__name__")
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            labels.update(node.modifier.labels)
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            if node.modifier.matching is not None:
                labels.update(node.modifier.matching.labels)
            labels.update(node.modifier.group_labels or [])

    promql_parser.walk(ast, visit)
    return names, labels


def check_promql(expr: str, where: str) -> set[str]:
    """Parse ``expr``; assert its metrics are exported and its labels exist on them."""
    try:
        names, labels = promql_references(expr)
    except (ValueError, RuntimeError) as exc:
        pytest.fail(f"{where}: PromQL does not parse: {exc}\n{expr}")
    allowed = allowed_series()
    unknown = sorted(n for n in names if n not in allowed)
    assert not unknown, (
        f"{where}: {unknown} are not metrics the worker exports (worker.ops.metrics.METRIC_NAMES)"
    )
    known_labels = TARGET_LABELS.union(*(allowed[n] for n in names))
    assert labels <= known_labels, (
        f"{where}: labels {sorted(labels - known_labels)} are on none of {sorted(names)}"
    )
    return names


def parse_duration_s(text: str) -> float:
    """Prometheus/compose durations such as ``15m``, ``1h30m``, ``45s``."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"bad duration {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def config_with_env(raw_toml: str, env: dict[str, str], tmp_path: Path) -> WorkerConfig:
    """Validate a deployment's worker config as the worker would, environment included.

    Model files live in the deployment's volume, so each model path is pointed at an
    empty file here first (``parse_config`` only checks that the file exists).
    """
    raw = tomllib.loads(raw_toml)
    for i, pipeline in enumerate(raw.get("pipelines", [])):
        path = Path(pipeline["model"]["path"])
        assert path.is_absolute() and path.parts[1] == "models", (
            f"pipelines[{i}].model.path {path} should be under the /models mount"
        )
        stand_in = tmp_path / f"model-{i}.onnx"
        stand_in.write_bytes(b"")
        pipeline["model"]["path"] = str(stand_in)
    return parse_config(raw, environ=env, base_dir=tmp_path, source="deployment config")


_VAR = re.compile(r"\$(?:\$|\{(?P<braced>[^}]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value: Any, env: dict[str, str], seen: set[str]) -> Any:
    """Compose's variable interpolation (``$$``, ``${X}``, ``${X:-d}``, ``${X-d}``)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env, seen) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, seen) for v in value]
    if not isinstance(value, str):
        return value

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        spec = match.group("braced") if match.group("braced") is not None else match["bare"]
        parts = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:-|-)(.*))?", spec)
        assert parts, f"unsupported interpolation ${{{spec}}}"
        name, sep, default = parts.groups()
        seen.add(name)
        assert sep is not None, f"${{{name}}} has no default: the stack must run without .env"
        return env.get(name) or default

    return _VAR.sub(sub, value)


@functools.cache
def compose() -> dict[str, Any]:
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    return interpolate(raw, {}, set())  # type: ignore[no-any-return]


def service_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def find_tool(name: str) -> str | None:
    local = ROOT / ".tools" / "bin" / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def need_tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        pytest.skip(
            f"{name} is not on PATH nor in .tools/bin; scripts/deploy-tools.sh {name} builds "
            "it (minutes: not part of CI; helm comes with the dev extra)"
        )
    return path


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- metrics


def test_metric_names_list_every_exported_family() -> None:
    assert set(METRIC_NAMES) == set(exported_families()), (
        "worker.ops.metrics.METRIC_NAMES and the families Metrics registers differ"
    )


def test_promql_reference_extraction() -> None:
    names, labels = promql_references(
        'sum by (pipeline) (rate(streamfer_records_total{pipeline=~"a"}[5m]))'
        " / ignoring(code) group_left histogram_quantile(0.9, sum by (le) "
        "(rate(streamfer_stage_seconds_bucket[5m])))"
    )
    assert names == {"streamfer_records_total", "streamfer_stage_seconds_bucket"}
    assert labels == {"pipeline", "code", "le"}
    with pytest.raises(AssertionError, match="not metrics the worker exports"):
        check_promql("rate(streamfer_records[5m])", "test")
    with pytest.raises(AssertionError, match="labels"):
        check_promql("sum by (stage) (streamfer_records_total)", "test")


# --------------------------------------------------------------------------- alerts


@functools.cache
def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_alert_rules_are_complete_and_query_exported_metrics() -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    assert set(doc) == {"groups"}
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names)), "alert names repeat"
    for rule in alert_rules():
        where = f"{ALERTS.name}: {rule['alert']}"
        assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
        assert re.fullmatch(r"Streamfer[A-Z][A-Za-z]+", rule["alert"]), where
        check_promql(rule["expr"], where)
        assert parse_duration_s(rule["for"]) >= 60, f"{where}: 'for' under a minute is noise"
        assert rule["labels"]["severity"] in {"warning", "critical"}, where
        for key in ("summary", "description"):
            text = rule["annotations"][key]
            assert text.count("{{") == text.count("}}"), f"{where}: unbalanced template in {key}"


def test_alerts_cover_the_operational_risks() -> None:
    by_metric: dict[str, set[str]] = {}
    for rule in alert_rules():
        for name in promql_references(rule["expr"])[0]:
            by_metric.setdefault(name, set()).add(rule["alert"])
    for metric in (
        "streamfer_consumer_lag",  # lag growing
        "streamfer_seconds_to_drain",
        "streamfer_dead_letters_total",
        "streamfer_commit_failures_total",
        "streamfer_ready",  # worker not ready
    ):
        assert metric in by_metric, f"no alert on {metric}"


def test_every_alert_has_a_promtool_unit_test() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    assert tests["rule_files"] == ["alerts.yml"]
    tested = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    missing = {rule["alert"] for rule in alert_rules()} - tested
    assert not missing, f"alerts never seen firing in {ALERT_TESTS.name}: {sorted(missing)}"


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = need_tool("promtool")
    for args in (
        ["check", "rules", str(ALERTS)],
        ["test", "rules", str(ALERT_TESTS)],
        ["check", "config", "--syntax-only", str(COMPOSE_DIR / "prometheus.yml")],
    ):
        done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"


# --------------------------------------------------------------------------- dashboard

GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$pipeline": ".*",
}


def dashboard_panels() -> Iterator[dict[str, Any]]:
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        yield panel
        yield from panel.get("panels", [])


def grafana_expr(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(f"${{{var[1:]}}}", value).replace(var, value)
    assert "$" not in expr, f"unknown dashboard variable in {expr!r}"
    return expr


def test_dashboard_queries_use_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "streamfer"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for var in variables.values():
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["query"]["query"])
            assert match, var["query"]
            assert match[2] in allowed_series()[match[1]], var["query"]
    used: set[str] = set()
    ids = []
    for panel in dashboard_panels():
        ids.append(panel["id"])
        if panel["type"] == "row":
            continue
        where = f"{DASHBOARD.name}: panel {panel['title']!r}"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel["targets"], f"{where} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], where
            used |= check_promql(grafana_expr(target["expr"]), where)
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for needed in (
        "streamfer_records_total",
        "streamfer_results_total",
        "streamfer_stage_seconds_bucket",
        "streamfer_end_to_end_seconds_bucket",
        "streamfer_consumer_lag",
        "streamfer_seconds_to_drain",
        "streamfer_dead_letters_total",
        "streamfer_batch_size_bucket",
    ):
        assert needed in used, f"the dashboard shows no {needed}"


def test_dashboard_required_panels() -> None:
    exprs = {
        panel["title"]: " ".join(t["expr"] for t in panel["targets"])
        for panel in dashboard_panels()
        if panel["type"] != "row"
    }

    def panel_with(*fragments: str) -> str:
        hits = [t for t, e in exprs.items() if all(f in e for f in fragments)]
        assert hits, f"no panel queries {fragments}"
        return hits[0]

    panel_with("rate(streamfer_records_total", "rate(streamfer_results_total")
    panel_with("histogram_quantile", "streamfer_stage_seconds_bucket", "by (le, stage)")
    panel_with("histogram_quantile", "streamfer_end_to_end_seconds_bucket")
    panel_with("streamfer_consumer_lag")
    panel_with("streamfer_seconds_to_drain")
    panel_with("streamfer_dead_letters_total", "code)")
    panel_with("streamfer_batch_size_bucket")


def test_dashboard_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


# --------------------------------------------------------------------------- Dockerfile


CUDA_BASE = re.compile(r"nvidia/cuda:(?P<major>\d+)\.\d+\.\d+-cudnn\d*-runtime-ubuntu\d+\.\d+")
PYTHON_BASE = re.compile(r"python:3\.11\.\d+-slim(-\w+)?")
LOCKS = {"cpu": ROOT / "constraints.txt", "gpu": ROOT / "constraints-gpu.txt"}
IMAGES = list(DOCKERFILES)


def dockerfile_args(path: Path) -> dict[str, str]:
    """Every ARG with a default, global or per stage (the names do not repeat here)."""
    pairs = [rest.split("=", 1) for word, rest in instructions(path) if word == "ARG"]
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}


def bases(path: Path) -> list[str]:
    """The image each stage is built FROM, build arguments resolved, in stage order."""
    args = dockerfile_args(path)
    found = [rest.split()[0] for word, rest in instructions(path) if word == "FROM"]
    return [re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], base) for base in found]


def last_of_each(path: Path) -> dict[str, str]:
    """The final stage's instructions, the last of each kind (the one that counts)."""
    return dict(stages(path)[""])


def project_dependencies(image: str) -> list[str]:
    """The runtime requirements of the distribution the image installs."""
    text = (ROOT / "pyproject.toml").read_text()
    if image == "gpu":
        text = gpu_dist().gpu_pyproject(text)
    return list(tomllib.loads(text)["project"]["dependencies"])


@pytest.mark.parametrize("image", IMAGES)
def test_dockerfile_runtime_contract(image: str) -> None:
    path = DOCKERFILES[image]
    found = bases(path)
    for base in found[:-1]:
        assert PYTHON_BASE.fullmatch(base), f"{path.name}: {base}: pin a patch release"
    final_base = CUDA_BASE if image == "gpu" else PYTHON_BASE
    assert final_base.fullmatch(found[-1]), f"{path.name}: {found[-1]}: pin a patch release"
    runs = [rest for word, rest in instructions(path) if word == "RUN"]
    target = "/src/streamfer-gpu" if image == "gpu" else "."
    (install,) = [r for r in runs if f"pip install --no-deps {target}" in r]
    assert "pip check" in install and "streamfer --version" in install
    if image == "gpu":
        assert f"build_gpu_dist.py project {target}" in install
    stage = stages(path)[""]
    one = last_of_each(path)
    user = one["USER"].split(":")[0]
    assert user not in {"root", "0"}, "the image must not run as root"
    assert one["EXPOSE"] == "9464"
    env = " ".join(rest for word, rest in stage if word == "ENV")
    assert "STREAMFER_METRICS__HOST=0.0.0.0" in env and "STREAMFER_METRICS__PORT=9464" in env
    entrypoint, cmd = json.loads(one["ENTRYPOINT"]), json.loads(one["CMD"])
    assert entrypoint == ["/usr/bin/tini", "--", "streamfer"], "tini as PID 1, exec form"
    assert any(w == "RUN" and "apt-get install" in r and "tini" in r for w, r in stage)
    assert cmd == ["run", "--config", "/etc/streamfer/worker.toml"]
    copies = " ".join(rest for word, rest in instructions(path) if word in {"COPY", "ADD"})
    assert ".onnx" not in copies and "models" not in copies, "no model is baked in"
    healthcheck = one["HEALTHCHECK"]
    assert "/healthz" in healthcheck and "curl" not in healthcheck and "wget" not in healthcheck


def healthcheck_command(path: Path) -> list[str]:
    return list(json.loads(last_of_each(path)["HEALTHCHECK"].split(" CMD ", 1)[1]))


@pytest.mark.parametrize("image", IMAGES)
@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_dockerfile_healthcheck_follows_healthz(image: str, status: int, healthy: bool) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        command = healthcheck_command(DOCKERFILES[image])
        assert command[0] == "python"
        env = {**os.environ, "STREAMFER_METRICS__PORT": str(server.server_address[1])}
        done = subprocess.run(
            [sys.executable, *command[1:]], env=env, capture_output=True, timeout=30
        )
        assert (done.returncode == 0) is healthy, done.stderr.decode()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("image", IMAGES)
def test_dependencies_install_from_the_lock_in_a_layer_before_the_code(image: str) -> None:
    """A code change must not reinstall onnxruntime: the lock is copied and installed
    before any source, and it pins every runtime dependency of the distribution the image
    installs at a version its floor allows (so the image runs what the tests ran against)."""
    from packaging.requirements import Requirement

    lock = LOCKS[image]
    order = [(w, r) for w, r in instructions(DOCKERFILES[image]) if w in {"COPY", "RUN"}]
    lock_at = next(i for i, (w, r) in enumerate(order) if w == "COPY" and lock.name in r)
    install_at = next(i for i, (w, r) in enumerate(order) if f"-r {lock.name}" in r)
    code_at = next(i for i, (w, r) in enumerate(order) if w == "COPY" and "worker" in r)
    assert lock_at < install_at < code_at
    pinned = {}
    for line in lock.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pinned[name.lower().replace("_", "-")] = version.strip()
    for dep in project_dependencies(image):
        req = Requirement(dep.split("#")[0])
        name = req.name.lower().replace("_", "-")
        assert name in pinned, f"{lock.name} lacks {name}"
        assert req.specifier.contains(pinned[name]), f"{name}=={pinned[name]} breaks {dep}"


@pytest.mark.parametrize("image", IMAGES)
def test_dockerignore_keeps_what_pip_install_needs(image: str) -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", "the context is an allowlist"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", pyproject["project"]["readme"], LOCKS[image].name}
    needed |= {p.split(".")[0] for p in pyproject["tool"]["setuptools"]["packages"]}
    if image == "gpu":
        needed.add("scripts/build_gpu_dist.py")
    assert needed <= allowed, f"the build context lacks {sorted(needed - allowed)}"
    copied = " ".join(rest for word, rest in instructions(DOCKERFILES[image]) if word == "COPY")
    for path in needed:
        assert path in copied, f"{DOCKERFILES[image].name} does not COPY {path}"


def test_gpu_image_keeps_the_cpu_images_contract() -> None:
    cpu, gpu = last_of_each(CPU), last_of_each(GPU)
    for word in ("USER", "EXPOSE", "ENTRYPOINT", "CMD"):
        assert gpu[word] == cpu[word], f"Dockerfile.gpu's {word} differs from Dockerfile's"
    assert healthcheck_command(GPU) == healthcheck_command(CPU)
    env = {
        name: " ".join(r for w, r in stages(path)[""] if w == "ENV")
        for name, path in DOCKERFILES.items()
    }
    for setting in ("PYTHONUNBUFFERED=1", "STREAMFER_METRICS__HOST=0.0.0.0"):
        assert setting in env["cpu"] and setting in env["gpu"], setting


def pin(line: str) -> bool:
    return "==" in line and not line.startswith("#")


def test_gpu_image_is_cuda_with_cudnn_and_the_gpu_runtime_only() -> None:
    dist = gpu_dist()
    base = CUDA_BASE.fullmatch(bases(GPU)[-1])
    assert base, "the GPU image runs on a pinned nvidia/cuda cudnn runtime tag"
    assert int(base["major"]) == dist.IMAGE_CUDA_MAJOR, (
        f"{bases(GPU)[-1]} is not CUDA {dist.IMAGE_CUDA_MAJOR}, the build of "
        f"onnxruntime-gpu {dist.IMAGE_GPU_RUNTIME_VERSION}"
    )
    lock = LOCKS["gpu"].read_text()
    assert lock == dist.gpu_lock(LOCKS["cpu"].read_text()), (
        "constraints-gpu.txt is stale: python scripts/build_gpu_dist.py lock"
    )
    names = {line.split("==")[0].lower() for line in lock.splitlines() if pin(line)}
    assert "onnxruntime-gpu" in names and "onnxruntime" not in names
    assert f"onnxruntime-gpu=={dist.IMAGE_GPU_RUNTIME_VERSION}" in lock.splitlines()
    # The rest of the lock is the CPU image's, pin for pin.
    cpu_pins = {line for line in LOCKS["cpu"].read_text().splitlines() if pin(line)}
    gpu_pins = {line for line in lock.splitlines() if pin(line)}
    assert cpu_pins - gpu_pins == {
        next(line for line in cpu_pins if line.startswith("onnxruntime=="))
    }
    assert gpu_pins - cpu_pins == {f"onnxruntime-gpu=={dist.IMAGE_GPU_RUNTIME_VERSION}"}


def test_gpu_image_tensorrt_is_an_option_with_a_cache_volume() -> None:
    args = dockerfile_args(GPU)
    assert args["TENSORRT"] == "0", "TensorRT is opt-in (--build-arg TENSORRT=1)"
    # ONNX Runtime 1.26's TensorRT provider links libnvinfer.so.10: TensorRT 10.
    assert re.fullmatch(r"10\.\d+\.\d+\.\d+", args["TENSORRT_VERSION"])
    major = gpu_dist().IMAGE_CUDA_MAJOR
    (trt,) = [r for w, r in instructions(GPU) if w == "RUN" and "tensorrt" in r]
    assert '[ "${TENSORRT}" = 1 ]' in trt
    assert f'"tensorrt-cu{major}-libs==${{TENSORRT_VERSION}}"' in trt
    assert "-c constraints-gpu.txt" in trt, "TensorRT must not move the locked pins"
    stage = stages(GPU)[""]
    volumes = [json.loads(r) for w, r in stage if w == "VOLUME"]
    assert ["/var/cache/streamfer/trt"] in volumes
    (owned,) = [r for w, r in stage if w == "RUN" and "chown" in r]
    assert "/var/cache/streamfer/trt" in owned.split("chown", 1)[1]
    python = ".".join(args["PYTHON_VERSION"].split(".")[:2])
    env = " ".join(r for w, r in stage if w == "ENV")
    assert f"/opt/streamfer/lib/python{python}/site-packages/tensorrt_libs" in env
    copied = [r for w, r in stage if w == "COPY"]
    assert "--from=build /opt/python /opt/python" in copied
    assert "--from=build /opt/streamfer /opt/streamfer" in copied


# --------------------------------------------------------------------------- compose


def test_compose_file_matches_the_compose_spec() -> None:
    schema = json.loads((HERE / "schemas" / "compose-spec.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(compose()), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_compose_variables_have_defaults() -> None:
    seen: set[str] = set()
    interpolate(yaml.safe_load(COMPOSE_FILE.read_text()), {}, seen)
    assert {"PARTITIONS", "RATE"} <= seen


def test_compose_references_resolve() -> None:
    doc = compose()
    services = doc["services"]
    assert {"kafka", "redis", "topic-init", "model-init", "worker", "producer"} <= set(services)
    assert {"prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        depends = service.get("depends_on", {})
        for dep in depends if isinstance(depends, list) else depends.keys():
            assert dep in services, f"{name} depends on unknown service {dep}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (COMPOSE_DIR / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in doc.get("volumes", {}), f"{name}: volume {source} undeclared"
        build = service.get("build")
        if build:
            assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).is_file()


def worker_service() -> dict[str, Any]:
    return compose()["services"]["worker"]  # type: ignore[no-any-return]


def compose_worker_config(tmp_path: Path) -> WorkerConfig:
    service = worker_service()
    mounts = dict(v.split(":")[:2][::-1] for v in service["volumes"])
    toml_source = COMPOSE_DIR / mounts["/etc/streamfer/worker.toml"]
    return config_with_env(toml_source.read_text(), service_env(service), tmp_path)


def test_compose_workers_scale_and_drain(tmp_path: Path) -> None:
    service = worker_service()
    config = compose_worker_config(tmp_path)
    assert "ports" not in service and "container_name" not in service, (
        "fixed host ports or a container name would stop --scale worker=N"
    )
    assert service["command"] == ["run", "--config", "/etc/streamfer/worker.toml"]
    assert parse_duration_s(service["stop_grace_period"]) >= config.shutdown_timeout_s + 10
    assert config.metrics.host == "0.0.0.0" and config.metrics.port == 9464
    assert "models:/models:ro" in service["volumes"]
    assert config.kafka.bootstrap_servers == "kafka:9092"
    assert config.redis.url.get_secret_value() == "redis://redis:6379/0"
    conditions = {k: v["condition"] for k, v in service["depends_on"].items()}
    assert conditions["topic-init"] == conditions["model-init"] == "service_completed_successfully"


def test_compose_topics_model_and_producer_agree(tmp_path: Path) -> None:
    config = compose_worker_config(tmp_path)
    services = compose()["services"]
    script = services["topic-init"]["command"][0]
    created = set(re.search(r"for topic in ([^;]+);", script)[1].split())  # type: ignore[index]
    for pipeline in config.pipelines:
        needed = {*pipeline.request_topics, pipeline.result_topic, pipeline.dead_letter_topic}
        assert needed <= created, f"topic-init does not create {sorted(needed - created)}"
    assert "--partitions" in script and "$PARTITIONS" in script

    model_init = services["model-init"]
    source = model_init["command"][0]
    compile(source, "model-init", "exec")
    raw = tomllib.loads((COMPOSE_DIR / "worker.toml").read_text())
    model_paths = [p["model"]["path"] for p in raw["pipelines"]]
    assert model_paths == re.findall(r'Path\("([^"]+)"\)', source)
    assert "models:/models" in model_init["volumes"]
    assert (
        service_env(model_init)["REDIS_URL"]
        == service_env(worker_service())["STREAMFER_REDIS__URL"]
    )

    producer_env = service_env(services["producer"])
    assert producer_env["TOPIC"] in config.pipelines[0].request_topics
    assert producer_env["BOOTSTRAP_SERVERS"] == config.kafka.bootstrap_servers


def test_compose_producer_requests_match_the_schema() -> None:
    from sklearn.datasets import load_breast_cancer

    producer = load_module(COMPOSE_DIR / "producer.py")
    entities = int(service_env(compose()["services"]["producer"])["ENTITIES"])
    assert entities == len(load_breast_cancer().data), "ENTITIES must match model-init's rows"
    schema = json.loads((ROOT / "schemas" / "request.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(7)
    good = bad = 0
    for seq in range(2000):
        key, value = producer.make_request(seq, rng, entities, 0.05)
        try:
            doc = json.loads(value)
        except ValueError:
            bad += 1
            continue
        validator.validate(doc)
        if doc["entity"] == "no-such-entity":
            bad += 1
        else:
            assert 0 <= int(doc["entity"][1:]) < entities and key == doc["entity"].encode()
            good += 1
    assert good > 1800 and bad > 40


def test_compose_prometheus_scrapes_every_worker(tmp_path: Path) -> None:
    config = compose_worker_config(tmp_path)
    prometheus = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["worker"] and sd["type"] == "A" and sd["port"] == config.metrics.port
    mounts = dict(v.split(":")[:2] for v in compose()["services"]["prometheus"]["volumes"])
    rules_target = mounts["../ops/prometheus/alerts.yml"]
    (pattern,) = prometheus["rule_files"]
    assert Path(rules_target).match(pattern), f"{rules_target} is not loaded by {pattern}"


def test_compose_grafana_provisions_the_ops_dashboard() -> None:
    grafana = compose()["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    provisioning = COMPOSE_DIR / "grafana" / "provisioning"
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboard_target = mounts["../ops/grafana/streamfer-dashboard.json"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "streamfer.yml").read_text())[
        "providers"
    ]
    assert Path(dashboard_target).parent == Path(provider["options"]["path"])
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert datasource["type"] == "prometheus" and datasource["isDefault"] is True
    assert datasource["url"] == "http://prometheus:9090"


# --------------------------------------------------------------------------- Helm chart


@functools.cache
def chart_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())  # type: ignore[no-any-return]


def test_chart_metadata_and_shared_files() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "streamfer"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert chart["appVersion"] == pyproject["project"]["version"]
    # One source: the chart's files are links to ops/prometheus and ops/grafana.
    for name, target in (("alerts.yml", ALERTS), ("streamfer-dashboard.json", DASHBOARD)):
        path = CHART / "files" / name
        assert path.is_symlink() and path.resolve() == target, f"{path} must link to {target}"


def test_chart_values_referenced_by_templates_exist() -> None:
    values = chart_values()
    for template in sorted((CHART / "templates").iterdir()):
        text = template.read_text()
        for ref in sorted(set(re.findall(r"\.Values((?:\.\w+)+)", text))):
            node: Any = values
            for part in ref.strip(".").split("."):
                assert isinstance(node, dict) and part in node, (
                    f"{template.name}: .Values{ref} is not in values.yaml"
                )
                node = node[part]


def chart_env(values: dict[str, Any]) -> dict[str, str]:
    """The STREAMFER_ variables templates/workload.yaml sets, for the default values."""
    return {
        "STREAMFER_KAFKA__BOOTSTRAP_SERVERS": values["kafka"]["bootstrapServers"],
        "STREAMFER_KAFKA__GROUP_ID": values["kafka"]["groupId"],
        "STREAMFER_KAFKA__AUTO_OFFSET_RESET": values["kafka"]["autoOffsetReset"],
        "STREAMFER_REDIS__URL": values["redis"]["url"],
        "STREAMFER_METRICS__HOST": "0.0.0.0",
        "STREAMFER_METRICS__PORT": str(values["metrics"]["port"]),
        "STREAMFER_SHUTDOWN_TIMEOUT_S": str(values["shutdownTimeoutSeconds"]),
    }


def test_chart_default_config_is_a_valid_worker_config(tmp_path: Path) -> None:
    values = chart_values()
    config = config_with_env(values["config"], chart_env(values), tmp_path)
    assert config.shutdown_timeout_s == values["shutdownTimeoutSeconds"]
    assert config.metrics.port == values["metrics"]["port"]
    topics = {t for p in config.pipelines for t in p.request_topics}
    assert set(values["autoscaling"]["topics"]) <= topics
    assert values["replicaCount"] <= values["partitions"]


# ---------------------------------------------------------------- Helm chart, rendered

KUBE_VERSION = "1.30.0"
ALL_FEATURES = {
    "autoscaling.enabled": "true",
    "autoscaling.maxReplicas": "50",
    "serviceMonitor.enabled": "true",
    "prometheusRule.enabled": "true",
    "grafanaDashboard.enabled": "true",
    "kafka.sasl.enabled": "true",
    "kafka.sasl.existingSecret": "kafka-credentials",
    "redis.existingSecret": "redis-credentials",
}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [need_tool("helm"), *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def render(overrides: dict[str, str] | None = None) -> list[dict[str, Any]]:
    sets = [f"--set={k}={v}" for k, v in (overrides or {}).items()]
    done = helm(
        "template",
        "demo",
        str(CHART),
        "--namespace",
        "streaming",
        "--kube-version",
        KUBE_VERSION,
        *sets,
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for doc in docs:
        key = doc["kind"]
        if key == "ConfigMap" and doc["metadata"]["name"].endswith("-dashboard"):
            key = "DashboardConfigMap"
        assert key not in out, f"two {key}s"
        out[key] = doc
    return out


GPU_WORKERS = {
    "gpu.enabled": "true",
    "gpu.resourceName": "nvidia.com/mig-1g.18gb",
    "gpu.image.repository": "registry.example.com/streamfer-gpu",
    "nodeSelector.nvidia\\.com/gpu\\.product": "NVIDIA-H200",
    "tolerations[0].key": "nvidia.com/gpu",
    "tolerations[0].operator": "Exists",
    "tolerations[0].effect": "NoSchedule",
    "resources.limits.memory": "4Gi",
}


@pytest.mark.parametrize(
    "overrides", [{}, ALL_FEATURES, GPU_WORKERS], ids=["defaults", "all-features", "gpu"]
)
def test_helm_lint(overrides: dict[str, str]) -> None:
    sets = [f"--set={k}={v}" for k, v in overrides.items()]
    done = helm("lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), *sets)
    assert done.returncode == 0, done.stdout + done.stderr


CRD_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}


STATEFUL_WITH_EXTRAS = {
    **ALL_FEATURES,
    "workload": "StatefulSet",
    "extraVolumes[0].name": "kafka-tls",
    "extraVolumes[0].secret.secretName": "kafka-client-tls",
    "extraVolumeMounts[0].name": "kafka-tls",
    "extraVolumeMounts[0].mountPath": "/etc/kafka-tls",
    "extraVolumeMounts[0].readOnly": "true",
    "extraEnvFrom[0].configMapRef.name": "streamfer-overrides",
}


GPU_STATEFUL_SHARED_CACHE = {
    **STATEFUL_WITH_EXTRAS,
    **GPU_WORKERS,
    "gpu.count": "2",
    "gpu.tensorrtCache.existingClaim": "streamfer-trt",
}


@pytest.mark.parametrize(
    "overrides",
    [{}, ALL_FEATURES, STATEFUL_WITH_EXTRAS, GPU_WORKERS, GPU_STATEFUL_SHARED_CACHE],
    ids=["defaults", "all-features", "statefulset-extras", "gpu", "gpu-statefulset-pvc"],
)
def test_helm_manifests_match_kubernetes_schemas(overrides: dict[str, str]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render(overrides)
    versions = sorted({"1.29.0", kubernetes_validate.latest_version()})
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue  # no schema ships for them: checked field by field below
        for version in versions:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{doc['kind']} {doc['metadata']['name']} on {version}: {exc.message}")


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (worker,) = deployment["spec"]["template"]["spec"]["containers"]
    return worker  # type: ignore[no-any-return]


def test_helm_deployment_drains_on_sigterm_and_probes_health(tmp_path: Path) -> None:
    values = chart_values()
    kinds = by_kind(render({"shutdownTimeoutSeconds": "90"}))
    deployment = kinds["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    worker = container(deployment)
    assert pod["terminationGracePeriodSeconds"] == 90 + values["terminationGraceExtraSeconds"]
    assert "lifecycle" not in worker, "SIGTERM drains the worker: no preStop hook"
    assert worker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert worker["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert deployment["spec"]["replicas"] == values["replicaCount"]
    assert worker["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True

    env = {e["name"]: e["value"] for e in worker["env"]}
    assert env["STREAMFER_SHUTDOWN_TIMEOUT_S"] == "90"
    mounts = {m["mountPath"]: m for m in worker["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True
    configmap = kinds["ConfigMap"]
    config = config_with_env(configmap["data"]["worker.toml"], env, tmp_path)
    assert config.shutdown_timeout_s == 90
    assert worker["ports"] == [
        {"name": "metrics", "containerPort": config.metrics.port, "protocol": "TCP"}
    ]
    service = kinds["Service"]
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"][0]["name"] == "metrics"


def test_helm_secrets_are_mounted_from_existing_secrets(tmp_path: Path) -> None:
    kinds = by_kind(render(ALL_FEATURES))
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    worker = container(kinds["Deployment"])
    values = chart_values()
    sasl = values["kafka"]["sasl"]
    assert "Secret" not in kinds, "the chart creates no Secret"
    env = {e["name"]: e for e in worker["env"]}
    assert "STREAMFER_REDIS__URL" not in env
    assert not [n for n in env if "PASSWORD" in n and not n.endswith("_FILE")]
    assert env["STREAMFER_KAFKA__SASL_USERNAME"]["valueFrom"]["secretKeyRef"] == {
        "name": "kafka-credentials",
        "key": sasl["usernameKey"],
    }
    # Each *_FILE variable names a file that a mounted Secret provides.
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    provided = {
        f"{mounts[v['name']]}/{item['path']}": (v["secret"]["secretName"], item["key"])
        for v in pod["volumes"]
        if "secret" in v
        for item in v["secret"]["items"]
    }
    file_env = {n: e["value"] for n, e in env.items() if n.endswith("_FILE")}
    assert {n: provided.get(path) for n, path in file_env.items()} == {
        "STREAMFER_KAFKA__SASL_PASSWORD_FILE": ("kafka-credentials", sasl["passwordKey"]),
        "STREAMFER_REDIS__URL_FILE": ("redis-credentials", values["redis"]["urlKey"]),
    }
    # The worker reads them (files stand in under tmp_path); a password that looks like a
    # number stays a string because it never passes through the environment.
    plain = {n: e["value"] for n, e in env.items() if "value" in e}
    plain["STREAMFER_KAFKA__SASL_USERNAME"] = "streamfer"
    for name, path in file_env.items():
        stand_in = tmp_path / Path(path).relative_to("/")
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        stand_in.write_text("redis://:pw@redis:6379/0\n" if "REDIS" in name else "1e3\n")
        plain[name] = str(stand_in)
    config = config_with_env(kinds["ConfigMap"]["data"]["worker.toml"], plain, tmp_path)
    assert config.redis.url.get_secret_value() == "redis://:pw@redis:6379/0"
    assert config.kafka.sasl_password is not None
    assert config.kafka.sasl_password.get_secret_value() == "1e3"
    options = config.kafka.client_options()
    assert options["security.protocol"] == sasl["securityProtocol"]
    assert options["sasl.mechanism"] == sasl["mechanism"]
    assert options["sasl.username"] == "streamfer"
    # KEDA reads the same Secret.
    auth = kinds["TriggerAuthentication"]["spec"]["secretTargetRef"]
    assert {(a["parameter"], a["name"], a["key"]) for a in auth} == {
        ("username", "kafka-credentials", sasl["usernameKey"]),
        ("password", "kafka-credentials", sasl["passwordKey"]),
    }


@pytest.mark.parametrize(("max_replicas", "expected"), [(50, 6), (3, 3)])
def test_helm_keda_scales_on_lag_up_to_the_partitions(max_replicas: int, expected: int) -> None:
    overrides = {**ALL_FEATURES, "autoscaling.maxReplicas": str(max_replicas)}
    kinds = by_kind(render(overrides))
    values = chart_values()
    assert values["partitions"] == 6
    spec = kinds["ScaledObject"]["spec"]
    assert set(spec) <= {
        "scaleTargetRef",
        "pollingInterval",
        "cooldownPeriod",
        "minReplicaCount",
        "maxReplicaCount",
        "advanced",
        "triggers",
        "idleReplicaCount",
        "fallback",
    }
    assert spec["maxReplicaCount"] == expected
    assert spec["scaleTargetRef"]["name"] == kinds["Deployment"]["metadata"]["name"]
    assert "replicas" not in kinds["Deployment"]["spec"], "KEDA owns the replica count"
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "kafka"
    metadata = trigger["metadata"]
    assert all(isinstance(v, str) for v in metadata.values()), "trigger metadata is strings"
    assert metadata["consumerGroup"] == values["kafka"]["groupId"]
    assert metadata["bootstrapServers"] == values["kafka"]["bootstrapServers"]
    # one trigger on the group's summed lag: per-topic triggers would be max'ed, not summed
    assert "topic" not in metadata
    assert values["autoscaling"]["topics"] == []
    assert metadata["limitToPartitionsWithLag"] == "false"
    assert metadata["excludePersistentLag"] == "false"
    assert metadata["offsetResetPolicy"] in {"earliest", "latest"}
    assert metadata["allowIdleConsumers"] == "false"
    assert metadata["sasl"] == "scram_sha512" and metadata["tls"] == "enable"
    assert (
        trigger["authenticationRef"]["name"] == kinds["TriggerAuthentication"]["metadata"]["name"]
    )


def test_helm_keda_listed_topics_get_a_trigger_each_and_options_pass_through() -> None:
    overrides = {
        **ALL_FEATURES,
        "autoscaling.topics[0]": "orders",
        "autoscaling.topics[1]": "payments",
        "autoscaling.limitToPartitionsWithLag": "true",
        "autoscaling.excludePersistentLag": "true",
    }
    triggers = by_kind(render(overrides))["ScaledObject"]["spec"]["triggers"]
    assert [t["metadata"]["topic"] for t in triggers] == ["orders", "payments"]
    for trigger in triggers:
        assert trigger["metadata"]["limitToPartitionsWithLag"] == "true"
        assert trigger["metadata"]["excludePersistentLag"] == "true"


def test_helm_statefulset_mode_gives_each_pod_its_name_as_group_instance_id() -> None:
    kinds = by_kind(render(STATEFUL_WITH_EXTRAS))
    assert "Deployment" not in kinds
    workload = kinds["StatefulSet"]
    spec = workload["spec"]
    assert spec["serviceName"] == kinds["Service"]["metadata"]["name"]
    assert spec["podManagementPolicy"] == "Parallel"
    assert "strategy" not in spec and spec["updateStrategy"]["type"] == "RollingUpdate"
    worker = container(workload)
    (instance,) = [e for e in worker["env"] if e["name"] == "STREAMFER_KAFKA__GROUP_INSTANCE_ID"]
    assert instance["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    target = kinds["ScaledObject"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("StatefulSet", workload["metadata"]["name"])
    pod = spec["template"]["spec"]
    assert {"name": "kafka-tls", "secret": {"secretName": "kafka-client-tls"}} in pod["volumes"]
    mounts = {m["name"]: m for m in worker["volumeMounts"]}
    assert mounts["kafka-tls"] == {
        "name": "kafka-tls",
        "mountPath": "/etc/kafka-tls",
        "readOnly": True,
    }
    assert worker["envFrom"] == [{"configMapRef": {"name": "streamfer-overrides"}}]


def test_helm_deployment_mode_sets_no_group_instance_id_and_a_budget_guards_drains() -> None:
    kinds = by_kind(render())
    worker = container(kinds["Deployment"])
    assert not [e for e in worker["env"] if e["name"] == "STREAMFER_KAFKA__GROUP_INSTANCE_ID"]
    assert "envFrom" not in worker
    budget = kinds["PodDisruptionBudget"]["spec"]
    assert budget["maxUnavailable"] == 1
    pod_labels = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert budget["selector"]["matchLabels"].items() <= pod_labels.items()
    assert "PodDisruptionBudget" not in by_kind(render({"podDisruptionBudget.enabled": "false"}))


TRT_CACHE = "/var/cache/streamfer/trt"


def test_helm_gpu_workers_request_the_device_run_the_gpu_image_and_mount_the_trt_cache() -> None:
    values = chart_values()
    assert values["gpu"]["enabled"] is False and values["gpu"]["count"] == 1
    assert values["gpu"]["resourceName"] == "nvidia.com/gpu"
    deployment = by_kind(render(GPU_WORKERS))["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    worker = container(deployment)
    assert worker["image"] == f"registry.example.com/streamfer-gpu:{chart_appversion()}"
    limits = worker["resources"]["limits"]
    assert limits == {"memory": "4Gi", "nvidia.com/mig-1g.18gb": 1}
    assert worker["resources"]["requests"] == values["resources"]["requests"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    mounts = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    cache = volumes[mounts[TRT_CACHE]]
    assert cache["emptyDir"] == {"sizeLimit": values["gpu"]["tensorrtCache"]["sizeLimit"]}
    assert worker["securityContext"]["readOnlyRootFilesystem"] is True, "the cache is a mount"

    shared = by_kind(render(GPU_STATEFUL_SHARED_CACHE))["StatefulSet"]
    worker = container(shared)
    assert worker["resources"]["limits"]["nvidia.com/mig-1g.18gb"] == 2
    mounts = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
    volumes = {v["name"]: v for v in shared["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts[TRT_CACHE]]["persistentVolumeClaim"] == {"claimName": "streamfer-trt"}

    # A plain GPU: the default resource name; without gpu.enabled no device, no cache.
    plain = container(by_kind(render({"gpu.enabled": "true"}))["Deployment"])
    assert plain["resources"]["limits"] == {"memory": "1Gi", "nvidia.com/gpu": 1}
    assert plain["image"] == f"streamfer-gpu:{chart_appversion()}"
    cpu = container(by_kind(render())["Deployment"])
    assert cpu["resources"] == values["resources"]
    assert cpu["image"] == f"streamfer:{chart_appversion()}"
    assert TRT_CACHE not in {m["mountPath"] for m in cpu["volumeMounts"]}


def chart_appversion() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def test_helm_monitoring_objects_embed_the_ops_files() -> None:
    kinds = by_kind(render(ALL_FEATURES))
    rule = kinds["PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    dashboard = kinds["DashboardConfigMap"]
    assert json.loads(dashboard["data"]["streamfer-dashboard.json"]) == json.loads(
        DASHBOARD.read_text()
    )
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    monitor = kinds["ServiceMonitor"]["spec"]
    assert (
        monitor["selector"]["matchLabels"].items() <= kinds["Service"]["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] == kinds["Service"]["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kafka.sasl.enabled": "true"}, "kafka.sasl.existingSecret"),
        ({"autoscaling.enabled": "true", "kafka.autoOffsetReset": "error"}, "offsetResetPolicy"),
        ({"workload": "DaemonSet"}, "workload"),
        ({"workers": "3"}, "Additional property workers is not allowed"),  # a typo
        ({"partitions": "0"}, "partitions: Must be greater than or equal to 1"),
        ({"kafka.autoOffsetReset": "smallest"}, "kafka.autoOffsetReset"),
        ({"autoscaling.lagThreshold": "lots"}, "autoscaling.lagThreshold"),
        ({"gpu.count": "0"}, "gpu.count: Must be greater than or equal to 1"),
        ({"gpu.resourceName": "nvidia gpu"}, "gpu.resourceName"),
        ({"gpu.enable": "true"}, "Additional property enable is not allowed"),  # a typo
        ({"gpu.tensorrtCache.sizeLimit": "lots"}, "gpu.tensorrtCache.sizeLimit"),
    ],
)
def test_helm_refuses_values_that_cannot_work(overrides: dict[str, str], message: str) -> None:
    sets = [f"--set={k}={v}" for k, v in overrides.items()]
    done = helm("template", "demo", str(CHART), "--kube-version", KUBE_VERSION, *sets)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_deploy_tools_script_is_valid_bash() -> None:
    script = ROOT / "scripts" / "deploy-tools.sh"
    assert os.access(script, os.X_OK)
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert ".tools/" in (ROOT / ".gitignore").read_text().splitlines()
