"""IOBinding: each batch through reused, bound host buffers, one binding per bucket.

With a GPU provider, ``session.run`` takes arrays in pageable memory, stages each copy
to the device, and allocates every output afresh on the device and on the host.
``BoundRunner`` instead keeps, for each batch-size bucket (``worker.inference.buckets``), input
buffers in pinned host memory where the provider offers it (``host_buffers``: ONNX
Runtime 1.2x's ``OrtEpDevice.memory_info(OrtDeviceMemoryType.HOST_ACCESSIBLE)`` with
``OrtValue.ortvalue_from_shape_and_type(..., memory_info=...)``; plain numpy arrays
otherwise), and output buffers in host memory where an output's shape follows from the
batch size (others are bound to ``"cpu"`` and allocated by Runtime). It binds them once
per bucket; a batch is copied into its bucket's inputs (padded with its first row),
run with ``run_with_iobinding``, and its valid output rows are copied out, since the
next batch reuses the buffers. Only models whose inputs and outputs are all numeric
tensors can be bound (``OnnxEngine`` checks). The CPU provider runs the very same code,
which is how CPU tests cover it. Called from one thread (the engine's).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.inference.buckets import Buckets, PaddedFeeds, rows_of

__all__ = ["BoundRunner", "HostBuffers", "OutputSpec", "host_buffers"]

log = logging.getLogger(__name__)

Array = npt.NDArray[Any]
MakeOrtValue = Callable[[list[int], Any], Any]

# What Runtime says when a preallocated output does not have the shape the run gives:
# "OrtValue shape verification failed. Current shape:{4,3} Requested shape:{8,3}"
# (1.18), "Shape mismatch attempting to re-use buffer" (an output a kernel reuses), "The
# output OrtValue provided for output 'Y' ... has shape {4,2} but the computed output
# shape for this run is {4,3}" (1.32).
_OUTPUT_SHAPE_MISMATCH = re.compile(
    r"shape verification failed|re-use buffer|computed output shape"
)


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """A model output as declared: name, shape (ints and names or None) and dtype."""

    name: str
    shape: Sequence[Any] | None
    dtype: np.dtype[Any]

    def rows_shape(self, rows: int) -> tuple[int, ...] | None:
        """Its shape for a batch of ``rows``, when the declaration fixes it: an open
        first axis (the batch) and fixed others. A fixed first axis (LightGBM's label
        declares 1 and returns a row per input) or open others: None."""
        shape = self.shape
        if not shape or isinstance(shape[0], int) or not all(isinstance(d, int) for d in shape[1:]):
            return None
        return (rows, *shape[1:])


class HostBuffers:
    """Makes host buffers: numpy views of OrtValues from ``make`` (pinned memory, when
    ``host_buffers`` found some) or plain numpy arrays. It keeps every OrtValue alive as
    long as itself, since the arrays are views of their memory."""

    __slots__ = ("_make", "_values", "pinned")

    def __init__(self, make: MakeOrtValue | None = None, *, pinned: bool = False) -> None:
        self._make = make
        self._values: dict[int, Any] = {}
        self.pinned = pinned

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Array:
        if self._make is None:
            return np.empty(shape, dtype=dtype)
        value = self._make(list(shape), dtype.type)
        array: Array = value.numpy()
        if array.ctypes.data != value.data_ptr():
            raise RuntimeError("OrtValue.numpy() copied the buffer instead of viewing it")
        self._values[array.ctypes.data] = value
        return array

    def ortvalue(self, array: Array) -> Any | None:
        """The OrtValue ``array`` views (to bind it as itself), or None for plain arrays."""
        return self._values.get(array.ctypes.data)


def host_buffers(providers: Sequence[str], device_id: int = 0) -> tuple[HostBuffers, str]:
    """Pinned host buffers from the first of ``providers`` whose device this ONNX Runtime
    hands them out for, else plain numpy buffers; and a few words saying which, and why,
    for the log."""
    import onnxruntime as ort

    get_devices = getattr(ort, "get_ep_devices", None)
    memory_type = getattr(getattr(ort, "OrtDeviceMemoryType", None), "HOST_ACCESSIBLE", None)
    if get_devices is None or memory_type is None:
        return HostBuffers(), (
            f"plain host buffers (onnxruntime {ort.__version__} has no get_ep_devices or "
            "HOST_ACCESSIBLE memory)"
        )
    for provider in providers:
        try:
            infos = [d.memory_info(memory_type) for d in get_devices() if d.ep_name == provider]
            infos = [info for info in infos if info is not None]
            if len(infos) <= device_id:
                continue
            info = infos[device_id]

            def make(shape: list[int], element_type: Any, info: Any = info) -> Any:
                return ort.OrtValue.ortvalue_from_shape_and_type(
                    shape, element_type, memory_info=info
                )

            pinned = HostBuffers(make, pinned=True)
            pinned((1,), np.dtype(np.float32))  # it works, and numpy views the memory
        except (TypeError, RuntimeError, ValueError, AttributeError) as exc:
            return HostBuffers(), f"plain host buffers (pinned memory refused: {exc})"
        return pinned, f"pinned host buffers ({provider} host-accessible memory)"
    return HostBuffers(), (
        f"plain host buffers ({' or '.join(providers)} offers no pinned host memory)"
    )


@dataclass(slots=True)
class _Bound:
    binding: Any
    inputs: dict[str, Array]
    outputs: list[Array] | None
    """Preallocated output buffers in ``wanted`` order; None: Runtime allocates them."""

    def holds(self, held: Mapping[str, Array]) -> bool:
        return all(self.inputs.get(name) is buf for name, buf in held.items())


class BoundRunner:
    """Runs batches of at most ``buckets.largest`` rows through per-bucket IOBindings.

    ``__call__`` returns the ``wanted`` outputs, each with the batch's rows, as arrays the
    caller owns. Raises what ``run_with_iobinding`` raises (the engine turns it into an
    EngineError, or halves the batch on a device out-of-memory error).
    """

    __slots__ = (
        "_bound",
        "_feeds",
        "_host",
        "_outputs",
        "_pinned_tried",
        "_session",
        "_shapes_fixed",
    )

    def __init__(
        self,
        session: Any,
        outputs: Sequence[OutputSpec],
        buckets: Buckets,
        host: HostBuffers | None = None,
    ) -> None:
        self._session = session
        self._outputs = list(outputs)
        self._host = host or HostBuffers()
        self._feeds = PaddedFeeds(buckets, self._host)
        self._bound: dict[int, _Bound] = {}
        self._shapes_fixed = True
        """False once a run showed the declared output shapes wrong: Runtime allocates."""
        self._pinned_tried = False

    @property
    def pinned(self) -> bool:
        return self._host.pinned

    def __call__(self, feeds: Mapping[str, Array], rows: int) -> list[Any]:
        size, held = self._feeds.fill(feeds, rows)
        bound = self._bound.get(size)
        if bound is None or not bound.holds(held):
            bound = self._bind(size, held)
        try:
            self._session.run_with_iobinding(bound.binding)
        except Exception as exc:
            if self._host.pinned and not self._pinned_tried:
                bound, size = self._without_pinned(feeds, rows, exc)
            elif bound.outputs is not None and _OUTPUT_SHAPE_MISMATCH.search(str(exc)):
                log.info(
                    "outputs %s are not the shape the model declares (%s); Runtime "
                    "allocates them from now on",
                    [o.name for o in self._outputs],
                    exc,
                )
                self._shapes_fixed = False
                self._bound.clear()
                bound = self._bind(size, held)
                self._session.run_with_iobinding(bound.binding)
            else:
                raise
        if bound.outputs is not None:
            return [buf[:rows].copy() for buf in bound.outputs]
        return [rows_of(v, rows, size) for v in bound.binding.copy_outputs_to_cpu()]

    def _without_pinned(
        self, feeds: Mapping[str, Array], rows: int, exc: Exception
    ) -> tuple[_Bound, int]:
        """The batch again on plain host buffers, once, after a run on pinned ones failed:
        if that run works, pinned buffers are given up for good (a warning says so);
        if it fails too, its error is raised and pinned buffers stay."""
        self._pinned_tried = True
        plain = HostBuffers()
        feeds_plain = PaddedFeeds(self._feeds.buckets, plain)
        size, held = feeds_plain.fill(feeds, rows)
        saved = self._bound
        self._bound = {}
        bound = self._bind(size, held, plain)
        try:
            self._session.run_with_iobinding(bound.binding)
        except Exception:
            self._bound = saved
            raise
        log.warning(
            "IOBinding: runs on pinned host buffers fail (%s); plain buffers from now on", exc
        )
        self._host, self._feeds = plain, feeds_plain
        return bound, size

    def _bind(
        self, size: int, held: Mapping[str, Array], host: HostBuffers | None = None
    ) -> _Bound:
        binding = self._session.io_binding()
        for name, buf in held.items():
            value = (host or self._host).ortvalue(buf)
            if value is not None:
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_input(name, "cpu", 0, buf.dtype.type, list(buf.shape), buf.ctypes.data)
        shapes = [o.rows_shape(size) for o in self._outputs] if self._shapes_fixed else []
        outputs: list[Array] | None = None
        if shapes and all(s is not None for s in shapes):
            outputs = []
            for spec, shape in zip(self._outputs, shapes, strict=True):
                assert shape is not None
                buf = np.empty(shape, dtype=spec.dtype)
                binding.bind_output(
                    spec.name, "cpu", 0, spec.dtype.type, list(shape), buf.ctypes.data
                )
                outputs.append(buf)
        else:
            for spec in self._outputs:
                binding.bind_output(spec.name, "cpu")
        bound = _Bound(binding, dict(held), outputs)
        self._bound[size] = bound
        return bound
