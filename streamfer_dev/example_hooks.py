"""The worked example of batch hooks in docs/how-to/own-model.md: each is called once per batch.

``prepare`` caps the ``amount`` column of the model's ``input`` (a one-input model such
as an exported PyTorch MLP, whose first column is ``amount``) and refuses a batch that
holds a request marked as a test probe: the worker then finds that request by
bisection and dead-letters it alone. ``postprocess`` turns the model's two-class scores
into the fields a downstream service wants.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["AMOUNT_CAP", "postprocess", "prepare"]

AMOUNT_CAP = 5_000.0


def prepare(
    requests: Sequence[Mapping[str, Any]], inputs: Mapping[str, npt.NDArray[Any]]
) -> dict[str, npt.NDArray[Any]]:
    if any(r.get("meta", {}).get("source") == "probe" for r in requests):
        raise ValueError("probe requests are not scored")
    x = inputs["input"].copy()
    np.minimum(x[:, 0], AMOUNT_CAP, out=x[:, 0])
    return {"input": x}


def postprocess(
    requests: Sequence[Mapping[str, Any]], outputs: Mapping[str, npt.NDArray[Any]]
) -> dict[str, npt.NDArray[Any]]:
    p_fraud = outputs["scores"][:, 1]
    return {
        "p_fraud": p_fraud,
        "decision": np.where(p_fraud > 0.5, "review", "pass"),
    }
