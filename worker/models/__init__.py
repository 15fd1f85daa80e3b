"""Which model a pipeline serves: loading and checking it (parts, fit), its canary and
shadow candidates, hot reload, waiting at start-up for a server that runs one, and their
metrics; and the pipeline assembled from those parts (assembly)."""

from __future__ import annotations

from worker.models.assembly import build_pipeline
from worker.models.candidates import load_candidates
from worker.models.graph import step_candidates
from worker.models.metrics import ModelFamilies
from worker.models.parts import LoadedModel, Parts, open_parts
from worker.models.reloader import ModelWatch, Reloader, show_model
from worker.models.server_start import when_served

__all__ = [
    "LoadedModel",
    "ModelFamilies",
    "ModelWatch",
    "Parts",
    "Reloader",
    "build_pipeline",
    "load_candidates",
    "open_parts",
    "show_model",
    "step_candidates",
    "when_served",
]
