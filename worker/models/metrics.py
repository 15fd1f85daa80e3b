"""The metrics of the models a pipeline serves: which one and on what provider, its
reloads, and its engine's calls (counted through the callbacks ``open_engine`` hands
the engine, which cannot see these families)."""

from __future__ import annotations

from worker.ops import Families, counter, gauge, histogram

__all__ = ["ModelFamilies"]


class ModelFamilies(Families):
    """The families loading, reloading and calling a model update."""

    model_info = gauge(
        "streamfer_model_info",
        "The model each pipeline serves (value is always 1)",
        "pipeline",
        "name",
        "version",
        "sha256",
        "provider",
    )
    inference_provider = gauge(
        "streamfer_inference_provider",
        "The execution provider that serves each pipeline's model, and the one the "
        "config asked for first (value is always 1; they differ after a fallback)",
        "pipeline",
        "provider",
        "requested",
    )
    model_reloads = counter(
        "streamfer_model_reloads",
        "New model versions or changed model files: loaded (now serving) or refused "
        "(failed to load, warm or fit the pipeline; the previous one keeps serving)",
        "pipeline",
        "result",
    )
    device_oom_retries = counter(
        "streamfer_device_oom_retries",
        "Batches halved and retried after the device (or its memory arena) ran out of memory",
        "pipeline",
    )
    triton_call_seconds = histogram(
        "streamfer_triton_call_seconds",
        "Seconds per call to the Triton Inference Server that runs a pipeline's model "
        "(a batch is one call per max_batch_size rows), failed calls included",
        "pipeline",
    )
    triton_errors = counter(
        "streamfer_triton_errors",
        "Failed calls to the Triton server: unavailable (down, past the timeout, "
        "overloaded, not serving the model: the batch waits and is retried) or model "
        "(the model refused the batch: its rows are tried apart)",
        "pipeline",
        "kind",
    )
