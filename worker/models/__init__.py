"""Which model a pipeline serves: loading and checking it (parts, fit), its canary and
shadow candidates, hot reload, and their metrics; and the pipeline assembled from those
parts (assembly)."""

from __future__ import annotations

from worker.models.assembly import build_pipeline
from worker.models.candidates import load_candidates
from worker.models.metrics import ModelFamilies
from worker.models.parts import LoadedModel, open_parts
from worker.models.reloader import ModelWatch, Reloader, show_model

__all__ = [
    "LoadedModel",
    "ModelFamilies",
    "ModelWatch",
    "Reloader",
    "build_pipeline",
    "load_candidates",
    "open_parts",
    "show_model",
]
