"""Hot reload: a new model version served without a restart, or refused and counted.

One background thread (``Reloader``) looks at each pipeline's model source
(``ModelWatch``): the highest version of a directory of versions
(``worker.config.model_versions``), or the model file itself. It looks every ``reload_poll_s``
where ``model.watch`` is on (the default for a directory), and at every pipeline
whenever it is asked to (SIGHUP, or ``POST /reload`` on the metrics endpoint).

A candidate is taken only once it has stopped changing (``SETTLE_S``: its size, mtime
and inode the same for that long, or its mtime that old), so a file still being written
is not loaded; unchanged content (the same SHA-256 and version) is not loaded again.
Then it is loaded, checked and warmed exactly as at start-up (``worker.models.parts.load_model``:
a pinned ``sha256`` refuses a changed file, the config must fit its inputs, every batch
bucket runs once), on this thread, beside the batches being served: it costs CPU (or
device memory: two sessions exist while it warms) but never holds a batch up. It must
feed like the live model (the same inputs fed by the same features, the same result
fields), because batches already enriched for the live model may run on it; and, unless
``model.allow_provider_change``, it must be served by the same execution provider (a
model that served on CUDA is not replaced by one that fell back to the CPU, many times
slower). Only then does ``ModelSlot.swap`` make it serve, from the next batch on, and
``on_swap`` hears of it (the output cache drops the old model's rows). A candidate that
fails any step is refused: logged once, counted, and not tried again until it changes
(a refused provider change too: replace or touch the file, or restart, to try again);
the live model keeps serving. ``streamfer_model_reloads_total{pipeline,result}`` counts
both outcomes; ``streamfer_model_info`` and ``streamfer_inference_provider`` follow the
live model (the old model's series are removed).

A model on a Triton server (``engine = "triton"``) has no file: its source is the
server, and a candidate is the highest version the server has ready
(``TritonEngine.latest_version``), followed by default unless the config pins
``triton.version``. It is loaded, checked, warmed and swapped in the same way, and a
refused version is not tried again until the worker restarts. A server that cannot
answer the look is left to the batches' own wait.

A model graph (``[[pipelines.steps]]``) is looked at step by step
(``worker.models.graph.step_candidates``): a new file or version of any step, once it
has settled as a single model's file does, or a new version ready on the server of a
step that runs there (``served_steps``), opens the whole graph again with it, checked
and swapped in as one model; a step is followed when its ``watch`` is on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from enum import Enum

from worker.config import ModelSpec, PipelineConfig
from worker.core import Clock, monotonic_clock, wall_clock
from worker.errors import EngineError, InferenceServerError
from worker.inference import (
    InferenceEngine,
    LiveModel,
    ModelIdentity,
    ModelSlot,
    TritonEngine,
    file_sha256,
)
from worker.models.fit import ModelFit
from worker.models.graph import StepFiles, served_steps, step_candidates
from worker.models.metrics import ModelFamilies
from worker.models.parts import LoadedModel, load_model
from worker.models.sources import Fingerprint, fingerprint, newest

__all__ = ["SETTLE_S", "Fingerprint", "Look", "ModelWatch", "Reloader", "show_model"]

log = logging.getLogger(__name__)

SETTLE_S = 1.0
"""How long a candidate file must have stayed the same before it is loaded."""
_TRIGGER_ROUNDS = 10
"""A triggered check waits for a settling file this many times ``SETTLE_S`` at most."""
_REFUSED_KEPT = 64

Load = Callable[[PipelineConfig, ModelSpec], LoadedModel]
Labels = tuple[str, str, str, str, str]
"""``streamfer_model_info``'s labels: pipeline, name, version, sha256, provider."""
ProviderLabels = tuple[str, str, str]
"""``streamfer_inference_provider``'s labels: pipeline, provider, requested."""


class Look(Enum):
    """What one look at a model source found."""

    IDLE = "idle"
    """Nothing new: the live model, one refused already, or no model there."""
    SETTLING = "settling"
    """A candidate that changed too recently (or while it loaded)."""
    LOADED = "loaded"
    REFUSED = "refused"


def show_model(
    metrics: ModelFamilies,
    pipeline: str,
    model: ModelIdentity,
    provider: str,
    *,
    hide: Labels | None,
) -> Labels:
    """Set ``streamfer_model_info`` for ``model`` (taking ``hide``'s series away)."""
    labels: Labels = (pipeline, model.name, model.version, model.sha256, provider)
    if hide is not None and hide != labels:
        with contextlib.suppress(KeyError):
            metrics.model_info.remove(*hide)
    metrics.model_info.labels(*labels).set(1)
    return labels


class ModelWatch:
    """One pipeline's model source and what was last seen of it. ``look`` is called by
    one thread at a time (the reloader's); ``serving`` is the model the pipeline started
    with and its feed plan, which every new version must match, and on whose provider
    it serves. ``on_swap`` is called with each engine swapped in, on that thread."""

    def __init__(
        self,
        config: PipelineConfig,
        slot: ModelSlot,
        serving: LoadedModel,
        metrics: ModelFamilies,
        *,
        shown: Labels,
        load: Load | None = None,
        settle_s: float = SETTLE_S,
        clock: Clock = monotonic_clock,
        wall: Clock = wall_clock,
        on_swap: Callable[[InferenceEngine], None] | None = None,
    ) -> None:
        self._config = config
        self._slot = slot
        self._fit = ModelFit.of(serving)
        self._metrics = metrics
        self._load: Load = load or (lambda cfg, spec: load_model(cfg, spec, metrics=metrics))
        self._settle_s = settle_s
        self._clock = clock
        self._wall = wall
        self._shown = shown
        self._on_swap = on_swap
        self._provider: ProviderLabels = (
            config.name,
            serving.engine.provider,
            config.model.providers[0],
        )
        self._loaded = metrics.model_reloads.labels(config.name, "loaded")
        self._refused_count = metrics.model_reloads.labels(config.name, "refused")
        self._live: Fingerprint | None = None
        self._pending: tuple[Fingerprint | StepFiles, float] | None = None
        self._refused: dict[Fingerprint, None] = {}
        self._refused_versions: set[str] = set()
        """Server versions refused (a model on Triton)."""
        self._missing_logged = False
        now = step_candidates(config) if config.steps else None
        self._steps_live: StepFiles | None = (
            served_steps(now[1], serving.engine, ask=False) if now is not None else None
        )
        self._steps_refused: dict[StepFiles, None] = {}

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def polls(self) -> bool:
        if self._config.steps:
            return any(bool(step.model.watch) for step in self._config.steps)
        return bool(self._config.model.watch)

    @property
    def poll_s(self) -> float:
        return self._config.model.reload_poll_s

    def look(self) -> Look:
        """Look at the source once; load, check, warm and swap in a settled candidate.
        Blocks while a candidate loads; never raises for a bad candidate."""
        if self._config.steps:
            return self._look_at_steps()
        if self._config.model.triton is not None:
            return self._look_at_server()
        candidate = newest(self._config.model)
        found = fingerprint(*candidate) if candidate is not None else None
        if found is None:
            if not self._missing_logged:
                self._missing_logged = True
                where = self._config.model.version_dir or self._config.model.path
                log.warning(
                    "pipeline %s: no model at %s now; the live one keeps serving",
                    self.name,
                    where,
                )
            return Look.IDLE
        self._missing_logged = False
        if found == self._live or found in self._refused:
            return Look.IDLE
        if not self._settled(found, found.mtime_ns):
            return Look.SETTLING
        return self._try(found)

    def _look_at_server(self) -> Look:
        """The server's highest ready version, loaded and swapped in when it is new."""
        settings = self._config.model.triton
        live = self._slot.for_batch()
        if settings is None or settings.version is not None:
            return Look.IDLE  # a pinned version: nothing to follow
        if not isinstance(live.engine, TritonEngine):
            return Look.IDLE
        try:
            version = live.engine.latest_version()
        except (InferenceServerError, EngineError) as exc:
            log.debug("pipeline %s: no version from the server now: %s", self.name, exc)
            return Look.IDLE
        if version is None or version == live.identity.version:
            return Look.IDLE
        if version in self._refused_versions:
            return Look.IDLE
        spec = self._config.model.model_copy(
            update={"triton": settings.model_copy(update={"version": version})}
        )
        started = time.perf_counter()
        loaded = self._load_or_refuse(
            self._config,
            spec,
            live.identity,
            f"model {spec.name} version {version} on the server",
            "it is not tried again until the worker restarts",
            lambda: self._refused_versions.add(version),
        )
        if loaded is None:
            return Look.REFUSED
        self._serve(spec, loaded, version, live.identity, started)
        return Look.LOADED

    def _look_at_steps(self) -> Look:
        """A graph: a step's new version (or changed file) reloads the graph with it,
        loaded, checked and warmed as at start-up; the other steps are opened again."""
        found = step_candidates(self._config)
        if found is None:
            return Look.IDLE
        config, files = found
        files = served_steps(files, self._slot.for_batch().engine, ask=True)
        if files == self._steps_live or files in self._steps_refused:
            return Look.IDLE
        was = self._steps_live or (None,) * len(files)
        changed = [
            f.mtime_ns
            for f, old in zip(files, was, strict=True)
            if isinstance(f, Fingerprint) and f != old
        ]
        if not self._settled(files, max(changed, default=0)):
            return Look.SETTLING
        live = self._slot.for_batch().identity
        started = time.perf_counter()
        loaded = self._load_or_refuse(
            config,
            config.model,
            live,
            f"model graph {config.model.name} version {config.model.version}",
            "it is not tried again until a step's file changes",
            lambda: self._steps_refused.setdefault(files),
        )
        if loaded is None:
            return Look.REFUSED
        self._steps_live, self._config = files, config
        version = getattr(loaded.engine, "served_version", None) or config.model.version
        self._serve(config.model, loaded, str(version), live, started)
        return Look.LOADED

    def _settled(self, found: Fingerprint | StepFiles, mtime_ns: int) -> bool:
        """Whether ``found`` (a file, or a graph's files) may be loaded: it has looked
        the same for ``settle_s`` (at every look since it was first seen so), or its
        newest file's ``mtime_ns`` is that old."""
        now = self._clock()
        if self._pending is None or self._pending[0] != found:
            self._pending = (found, now)
        quiet = now - self._pending[1] >= self._settle_s
        old = self._wall() - mtime_ns / 1e9 >= self._settle_s
        if quiet or old:
            self._pending = None
        return quiet or old

    def _try(self, found: Fingerprint) -> Look:
        live = self._slot.for_batch().identity
        try:
            sha = file_sha256(found.path)
        except OSError:
            return Look.SETTLING  # gone again: look at what is there next time
        if sha == live.sha256 and found.version == live.version:
            self._live = found  # what is serving already
            return Look.IDLE
        spec = self._config.model.model_copy(update={"path": found.path, "version": found.version})
        started = time.perf_counter()
        loaded = self._load_or_refuse(
            self._config,
            spec,
            live,
            f"model version {found.version} at {found.path}",
            "this file is not tried again until it changes",
            lambda: self._refuse(found),
            same_provider=True,
        )
        if loaded is None:
            return Look.REFUSED
        if fingerprint(found.version, found.path) != found:
            return Look.SETTLING  # changed while it loaded: not this one
        self._live = found
        self._serve(spec, loaded, found.version, live, started)
        return Look.LOADED

    def _serve(
        self,
        spec: ModelSpec,
        loaded: LoadedModel,
        version: str,
        live: ModelIdentity,
        started: float,
    ) -> None:
        """Swap a checked, warmed candidate in; metrics, ``on_swap`` and the log follow."""
        engine = loaded.engine
        model = ModelIdentity(spec.name, version, engine.model_hash)
        self._slot.swap(LiveModel(engine, model))
        self._shown = show_model(
            self._metrics, self.name, model, engine.providers[0], hide=self._shown
        )
        self._show_provider((self.name, engine.provider, spec.providers[0]))
        if self._on_swap is not None:
            self._on_swap(engine)
        self._loaded.inc()
        log.info(
            "pipeline %s: model %s version %s (sha256 %s) loaded, checked and warmed in "
            "%.0f ms; it serves from the next batch on, after version %s (sha256 %s)",
            self.name,
            model.name,
            model.version,
            model.sha256[:12],
            1000 * (time.perf_counter() - started),
            live.version,
            live.sha256[:12],
        )

    def _same_provider(self, provider: str) -> None:
        """Raise EngineError when ``provider`` is not the live model's and the config
        does not allow that."""
        live = self._provider[1]
        if provider != live and not self._config.model.allow_provider_change:
            raise EngineError(
                f"it would be served by {provider}, the live model by {live}; set "
                "model.allow_provider_change = true to allow that"
            )

    def _show_provider(self, labels: ProviderLabels) -> None:
        """Set ``streamfer_inference_provider`` for the new engine, the old one's gone."""
        gauge = self._metrics.inference_provider
        if labels != self._provider:
            with contextlib.suppress(KeyError):
                gauge.remove(*self._provider)
        gauge.labels(*labels).set(1)
        self._provider = labels

    def _refuse(self, found: Fingerprint) -> None:
        """Remember ``found`` as refused (the last ``_REFUSED_KEPT`` of them)."""
        self._refused[found] = None
        while len(self._refused) > _REFUSED_KEPT:
            del self._refused[next(iter(self._refused))]

    def _load_or_refuse(
        self,
        config: PipelineConfig,
        spec: ModelSpec,
        live: ModelIdentity,
        what: str,
        again: str,
        remember: Callable[[], None],
        *,
        same_provider: bool = False,
    ) -> LoadedModel | None:
        """``spec`` loaded, warmed and checked against the live model (its feeds and
        results, and with ``same_provider`` its provider); None when it is refused:
        ``remember`` is called so it is not tried again, and the refusal is counted and
        logged once, naming ``what`` was refused and when it is tried ``again``."""
        try:
            loaded = self._load(config, spec)
            self._fit.check(ModelFit.of(loaded), "the live model's")
            if same_provider:
                self._same_provider(loaded.engine.provider)
        except Exception as exc:  # onnxruntime and the server raise their own errors too
            remember()
            self._refused_count.inc()
            log.error(
                "pipeline %s: %s refused (%s); version %s keeps serving, and %s",
                self.name,
                what,
                str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__,
                live.version,
                again,
            )
            return None
        return loaded


class Reloader:
    """Runs every ``ModelWatch`` on one daemon thread: each polling one at its interval,
    all of them when ``requests`` is set (SIGHUP, ``POST /reload``: setting the event is
    all a signal handler does)."""

    def __init__(
        self,
        watches: Sequence[ModelWatch],
        *,
        requests: threading.Event | None = None,
        settle_s: float = SETTLE_S,
        clock: Clock = monotonic_clock,
    ) -> None:
        """``clock`` times each watch's polls."""
        self._watches = list(watches)
        self._clock = clock
        self._requests = requests or threading.Event()
        self._settle_s = settle_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="streamfer-reload", daemon=True)

    def request(self) -> None:
        """Look at every pipeline's model now (from any thread, or a signal handler)."""
        self._requests.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop looking; True when the thread ended within ``timeout`` (a load that is
        under way finishes first, then is not swapped in)."""
        self._stop.set()
        self._requests.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def check_now(self) -> dict[str, Look]:
        """What a request does, on the calling thread: every pipeline looked at, a
        settling candidate waited for (up to ``_TRIGGER_ROUNDS`` x ``settle_s``)."""
        looks = {w.name: w.look() for w in self._watches}
        for _ in range(_TRIGGER_ROUNDS):
            settling = [w for w in self._watches if looks[w.name] is Look.SETTLING]
            if not settling or self._stop.wait(self._settle_s):
                break
            looks.update({w.name: w.look() for w in settling})
        return looks

    def _run(self) -> None:
        polling = [w for w in self._watches if w.polls]
        clock = self._clock
        due = {w.name: clock() + w.poll_s for w in polling}
        while not self._stop.is_set():
            now = clock()
            wait = max(0.0, min(due.values()) - now) if due else None
            asked = self._requests.wait(wait)
            if self._stop.is_set():
                return
            try:
                if asked:
                    self._requests.clear()
                    log.info("reload requested: looking at every pipeline's model")
                    self.check_now()
                else:
                    now = clock()
                    for w in polling:
                        if due[w.name] <= now:
                            w.look()
                            due[w.name] = clock() + w.poll_s
            except Exception:  # a fault here must never stop the serving
                log.exception("model reload check failed; the live models keep serving")
