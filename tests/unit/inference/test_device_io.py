"""IOBinding through bound, reused host buffers, run by the CPU provider: the same code
path a GPU provider runs, with results compared to ``session.run`` exactly."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from worker.inference.buckets import Buckets
from worker.inference.device_io import BoundRunner, HostBuffers, OutputSpec, host_buffers
from worker.inference.engine import warm_up_sizes

SIZES = warm_up_sizes(64)


def _model(path: Path, nodes: list[Any], inputs: list[Any], outputs: list[Any]) -> Path:
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def _two_outputs(path: Path, *, open_width: bool = False) -> Path:
    """y = 2x + 1 [N, 3] and s = the row sums of x [N]; with ``open_width`` the first
    output's width is left open, so its shape cannot be known before a run."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Constant", [], ["c2"], value=two),
        helper.make_node("Constant", [], ["c1"], value=one),
        helper.make_node("Constant", [], ["ax"], value=axes),
        helper.make_node("Mul", ["X", "c2"], ["x2"]),
        helper.make_node("Add", ["x2", "c1"], ["y"]),
        helper.make_node("ReduceSum", ["X", "ax"], ["s"], keepdims=0),
    ]
    width = "W" if open_width else 3
    return _model(
        path,
        nodes,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N"]),
        ],
    )


def _session(path: Path) -> Any:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _runner(session: Any, wanted: list[str], host: HostBuffers | None = None) -> BoundRunner:
    by_name = {o.name: o for o in session.get_outputs()}
    specs = [OutputSpec(n, by_name[n].shape, np.dtype(np.float32)) for n in wanted]
    return BoundRunner(session, specs, Buckets(SIZES), host)


def _cpu_ortvalues() -> HostBuffers:
    """Buffers that are OrtValues, as pinned ones are: bound with bind_ortvalue_input.
    Before ONNX Runtime 1.2x ``OrtValue.numpy()`` copies, so no such buffer can be
    written through numpy (and no pinned memory is offered either)."""
    probe = ort.OrtValue.ortvalue_from_shape_and_type([1], np.float32)
    if probe.numpy().ctypes.data != probe.data_ptr():
        pytest.skip(f"onnxruntime {ort.__version__}: OrtValue.numpy() copies")
    return HostBuffers(lambda shape, dtype: ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype))


@pytest.mark.parametrize("host", ["numpy", "ortvalue"])
@pytest.mark.parametrize("open_width", [False, True], ids=["preallocated", "runtime-allocated"])
def test_bound_runs_equal_session_run_at_every_size(
    tmp_path: Path, host: str, open_width: bool
) -> None:
    session = _session(_two_outputs(tmp_path / "m.onnx", open_width=open_width))
    runner = _runner(session, ["y", "s"], _cpu_ortvalues() if host == "ortvalue" else None)
    rng = np.random.default_rng(5)
    kept = []
    for rows in [*range(1, 65), 17, 3, 64, 1]:  # every size, then sizes again in used buckets
        x = rng.standard_normal((rows, 3), dtype=np.float32)
        got = runner({"X": x}, rows)
        want = session.run(["y", "s"], {"X": x})
        assert [g.shape for g in got] == [(rows, 3), (rows,)]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
        kept.append((x, got))
    # what a run returned is the caller's: later runs reuse the buffers, not those arrays
    for x, got in kept:
        np.testing.assert_array_equal(got[0], 2 * x + 1)


def test_one_binding_per_bucket_and_each_made_once(tmp_path: Path) -> None:
    session = _session(_two_outputs(tmp_path / "m.onnx"))
    made: list[int] = []
    real = session.io_binding

    def counting() -> Any:
        made.append(1)
        return real()

    session.io_binding = counting
    runner = _runner(session, ["y", "s"])
    for rows in [1, 2, 3, 4, 5, 8, 64, 33, 3, 1]:
        runner({"X": np.ones((rows, 3), dtype=np.float32)}, rows)
    assert len(made) == len({1, 2, 4, 8, 64})


def test_an_output_unlike_its_declaration_is_rebound_and_not_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Reshape [N, 6] -> [-1, 3] declared [N, 3]: the run gives 2N rows, so the buffer
    made from the declaration is refused; Runtime allocates from then on, and the output
    comes back whole (two rows per input row), for warm-up to refuse."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 3])
    path = _model(
        tmp_path / "r.onnx",
        [
            helper.make_node("Constant", [], ["sh"], value=shape),
            helper.make_node("Reshape", ["X", "sh"], ["y"]),
        ],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
    )
    session = _session(path)
    runner = _runner(session, ["y"])
    x = np.arange(18, dtype=np.float32).reshape(3, 6)
    with caplog.at_level(logging.INFO, logger="worker.inference.device_io"):
        (got,) = runner({"X": x}, 3)
    assert "are not the shape the model declares" in caplog.text
    assert got.shape == (8, 3)  # bucket 4, two rows each
    np.testing.assert_array_equal(got[:6], x.reshape(-1, 3))
    (again,) = runner({"X": x[:1]}, 1)
    np.testing.assert_array_equal(again, x[:1].reshape(-1, 3))


def test_a_failing_run_raises_runtimes_error(tmp_path: Path) -> None:
    session = _session(_two_outputs(tmp_path / "m.onnx"))
    runner = _runner(session, ["y", "s"])
    with pytest.raises(Exception, match="X"):
        runner({"X": np.ones((2, 4), dtype=np.float32)}, 2)  # the model takes 3 columns


def _no_pinned_memory(provider: str) -> str:
    if hasattr(ort, "get_ep_devices"):
        return f"plain host buffers ({provider} offers no pinned host memory)"
    return (
        f"plain host buffers (onnxruntime {ort.__version__} has no get_ep_devices or "
        "HOST_ACCESSIBLE memory)"
    )


def test_the_cpu_provider_offers_no_pinned_memory_so_buffers_are_plain() -> None:
    host, note = host_buffers(["CPUExecutionProvider"])
    assert not host.pinned
    assert note == _no_pinned_memory("CPUExecutionProvider")
    buf = host((4, 3), np.dtype(np.float32))
    assert buf.shape == (4, 3) and host.ortvalue(buf) is None


def test_no_cuda_device_here_means_plain_buffers() -> None:
    host, note = host_buffers(["TensorrtExecutionProvider", "CUDAExecutionProvider"])
    assert not host.pinned
    assert note == _no_pinned_memory("TensorrtExecutionProvider or CUDAExecutionProvider")


def test_ortvalue_buffers_are_views_kept_alive() -> None:
    host = _cpu_ortvalues()
    buf = host((2, 2), np.dtype(np.float32))
    value = host.ortvalue(buf)
    assert value is not None and value.data_ptr() == buf.ctypes.data
    buf[:] = 4.0
    np.testing.assert_array_equal(value.numpy(), np.full((2, 2), 4.0, dtype=np.float32))


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        (["N", 3], (8, 3)),
        ([None, 2, 2], (8, 2, 2)),
        (["batch"], (8,)),
        ([1], None),  # LightGBM's label: declared one row, returns one per input
        (["N", None], None),
        (["N", "W"], None),
        ([], None),
        (None, None),
    ],
)
def test_output_shape_known_from_the_declaration(
    shape: list[Any] | None, expected: tuple[int, ...] | None
) -> None:
    assert OutputSpec("o", shape, np.dtype(np.float32)).rows_shape(8) == expected


def test_an_ortvalue_whose_numpy_is_a_copy_is_refused() -> None:
    """What ONNX Runtime before 1.2x does: such buffers would never reach the model, so
    ``host_buffers`` falls back to plain ones when its probe buffer is refused."""

    class Copying:
        def __init__(self, shape: list[int], dtype: Any) -> None:
            self._value = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype)

        def numpy(self) -> Any:
            return self._value.numpy().copy()

        def data_ptr(self) -> int:
            return int(self._value.data_ptr())

    with pytest.raises(RuntimeError, match="copied the buffer instead of viewing it"):
        HostBuffers(Copying)((2, 2), np.dtype(np.float32))


class _FailsFirstRuns:
    """A real session whose first ``fails`` IOBinding runs raise, as a provider that
    refuses pinned buffers would."""

    def __init__(self, session: Any, fails: int) -> None:
        self._session = session
        self.fails = fails

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def run_with_iobinding(self, binding: Any) -> None:
        if self.fails > 0:
            self.fails -= 1
            raise RuntimeError("input 'X' is on a device this provider cannot read")
        self._session.run_with_iobinding(binding)


def test_pinned_buffers_that_fail_are_given_up_for_plain_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    real = _session(_two_outputs(tmp_path / "m.onnx"))
    values = _cpu_ortvalues()
    pinned = HostBuffers(values._make, pinned=True)
    session = _FailsFirstRuns(real, fails=1)
    runner = _runner(session, ["y", "s"], pinned)
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    with caplog.at_level(logging.WARNING, logger="worker.inference.device_io"):
        y, s = runner({"X": x}, 5)
    assert "runs on pinned host buffers fail (input 'X' is on a device" in caplog.text
    np.testing.assert_array_equal(y, 2 * x + 1)
    np.testing.assert_array_equal(s, x.sum(axis=1))
    assert not runner.pinned
    y, _s = runner({"X": x[:2]}, 2)
    np.testing.assert_array_equal(y, 2 * x[:2] + 1)


def test_a_failure_on_plain_buffers_too_is_raised_and_pinned_ones_stay(tmp_path: Path) -> None:
    real = _session(_two_outputs(tmp_path / "m.onnx"))
    pinned = HostBuffers(_cpu_ortvalues()._make, pinned=True)
    runner = _runner(_FailsFirstRuns(real, fails=2), ["y", "s"], pinned)
    with pytest.raises(RuntimeError, match="cannot read"):
        runner({"X": np.ones((3, 3), dtype=np.float32)}, 3)
    assert runner.pinned
    y, _s = runner({"X": np.ones((3, 3), dtype=np.float32)}, 3)
    np.testing.assert_array_equal(y, np.full((3, 3), 3.0, dtype=np.float32))
