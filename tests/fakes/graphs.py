"""Model graphs for the unit tests, of real ONNX files: two classifiers of features
``a``, ``b`` and ``c`` (probabilities, 2 wide), the mean of two such, and a regressor of
2 inputs (``graph_models``); the ensemble of the first three as steps
(``ensemble_steps``); and a pipeline config of steps (``graph_config``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamfer_dev.modelgen import make_mean
from tests.fakes.onnx_models import random_mlp
from tests.fakes.pipeline import FIELDS, pipeline_of
from worker.config import PipelineConfig

__all__ = ["FIELDS", "ensemble_steps", "graph_config", "graph_models"]


def graph_models(d: Path) -> dict[str, Path]:
    """The models, written in ``d``: ``one``, ``two``, ``mean`` and ``head``."""
    return {
        "one": random_mlp(d / "one.onnx", seed=1),
        "two": random_mlp(d / "two.onnx", seed=2),
        "mean": make_mean(d / "mean.onnx", ["x", "y"], 2),
        "head": random_mlp(d / "head.onnx", n_in=2, seed=3, softmax=False),
    }


def ensemble_steps(models: dict[str, Path]) -> list[dict[str, Any]]:
    return [
        {
            "name": "one",
            "model": {"path": models["one"], "name": "one"},
            "inputs": {"input": FIELDS},
        },
        {
            "name": "two",
            "model": {"path": models["two"], "name": "two", "version": "7"},
            "inputs": {"input": ["c", "b", "a"]},
            "publish": {"second": "probabilities"},
        },
        {
            "name": "avg",
            "model": {"path": models["mean"], "name": "avg"},
            "inputs": {"x": "one.probabilities", "y": "two.probabilities"},
        },
    ]


def graph_config(steps: list[dict[str, Any]], **tables: Any) -> PipelineConfig:
    """``pipeline_of`` serving ``steps``, with ``tables``."""
    return pipeline_of(steps=steps, **tables)
