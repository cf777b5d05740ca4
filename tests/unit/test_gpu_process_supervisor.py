"""What decides around the GPU process, with literal inputs: whether the setting turns it on
on a described machine (and whether as the CPU stand-in), when the main process counts it
dead or hung and how soon it restarts it, which GPU process a session goes to, and the
control messages' round trips."""

from __future__ import annotations

import numpy as np
import pytest

from edge_vision.config import ServerConfig
from edge_vision.engines.choice import Machine
from edge_vision.gpu_process import decide
from edge_vision.gpu_process.handoff import pick_link
from edge_vision.gpu_process.ring import Record
from edge_vision.gpu_process.supervisor import judge, restart_delay
from edge_vision.gpu_process.wire import (
    DEFLATE_FROM,
    FRAME,
    RESULT,
    SUBMIT,
    Result,
    StageTimes,
    Submit,
    cancel,
    decode_cancel,
    decode_outputs,
    encode_outputs,
)

H100 = Machine("NVIDIA H100 80GB HBM3", False, False, "13.0", True, triton=True, cores=16)
CPU = Machine(None, False, False, None, False, cores=2)


def test_the_setting_on_a_described_machine() -> None:
    assert decide("off", "torch", H100, 1) is None  # the default until the GPU proof
    on = decide("auto", "torch", H100, 8)
    assert on is not None and on.count == 8 and not on.stand_in  # one a GPU
    assert decide("auto", "onnxruntime", H100, 1) is None  # a CPU engine: workers as ever
    assert decide("auto", "onnxruntime", CPU, 0) is None
    stand_in = decide("on", "onnxruntime", CPU, 0)
    assert stand_in is not None and stand_in.stand_in and stand_in.count == 1
    assert "stand-in" in stand_in.reason
    forced = decide("on", "torch", CPU, 0)  # no GPU here: the stand-in, said so
    assert forced is not None and forced.stand_in and "no NVIDIA GPU" in forced.reason
    remote = decide("on", "triton", CPU, 0)  # Triton's engine is elsewhere: kept, not stood in
    assert remote is not None and not remote.stand_in and remote.count == 1
    assert decide("auto", "triton", H100, 1) is None


def test_yaml_on_and_off_mean_the_words() -> None:
    assert ServerConfig(gpu_process=True).gpu_process == "on"
    assert ServerConfig(gpu_process=False).gpu_process == "off"
    assert ServerConfig().gpu_process == "off"
    with pytest.raises(ValueError):
        ServerConfig(gpu_process="sometimes")


def test_dead_or_hung_and_the_start_gets_its_own_limit() -> None:
    assert judge(False, 0.1, 50.0, True) == "dead"
    assert judge(True, 0.3, 50.0, True) == "ok"
    assert judge(True, 10.5, 50.0, True, hang_after_s=10.0) == "hung"
    # Before its first ready, a silent loop (a compile, a model load) is given the start
    # timeout, not the hang limit.
    assert judge(True, None, 120.0, False, start_timeout_s=600.0) == "ok"
    assert judge(True, 30.0, 120.0, False, hang_after_s=10.0, start_timeout_s=600.0) == "ok"
    assert judge(True, None, 601.0, False, start_timeout_s=600.0) == "hung"


def test_a_gpu_process_that_keeps_failing_is_restarted_ever_more_slowly() -> None:
    assert [restart_delay(n) for n in range(1, 8)] == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert restart_delay(40) == 10.0


def test_a_session_goes_to_the_ready_gpu_process_with_the_fewest_frames() -> None:
    assert pick_link([True], [7]) == 0
    assert pick_link([True, True, True], [4, 2, 2]) == 1
    assert pick_link([True, False, True], [3, 0, 5]) == 0  # a restarting one gets none
    assert pick_link([False, False], [0, 0]) is None


def test_a_submit_round_trips_with_its_settings() -> None:
    sub = Submit(7, Record(128, 90_000, 3), 12, True, True, 0.4, 480, frozenset({0, 5}))
    data = sub.encode()
    length, kind = FRAME.unpack_from(data)
    assert kind == SUBMIT and length == len(data) - FRAME.size
    again = Submit.decode(data[FRAME.size :])
    assert again.seq == 7 and again.record == Record(128, 90_000, 3) and again.session == 12
    assert again.latest and again.quads and again.input_size == 480
    assert again.classes == frozenset({0, 5}) and abs(again.confidence - 0.4) < 1e-6
    every = Submit(8, Record(0, 1, 1), 1, False, False, 0.5, None, None)
    back = Submit.decode(every.encode()[FRAME.size :])
    assert not back.latest and back.classes is None and back.input_size is None
    none_wanted = Submit(9, Record(0, 1, 1), 1, False, False, 0.5, None, frozenset())
    assert Submit.decode(none_wanted.encode()[FRAME.size :]).classes == frozenset()
    assert decode_cancel(cancel(99)[FRAME.size :]) == 99


def test_a_result_carries_detections_rectangles_times_and_errors() -> None:
    dets = np.array([[1, 2, 30, 40, 0.9, 0], [5, 6, 7, 8, 0.5, 0]], np.float32)
    quads = np.arange(16, dtype=np.float32).reshape(2, 4, 2)
    times = StageTimes(0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 12, 345)
    data = Result(5, "ok", dets, quads, times).encode()
    assert FRAME.unpack_from(data)[1] == RESULT
    got = Result.decode(data[FRAME.size :])
    assert got.outcome == "ok" and got.times.batch == 345 and got.times.batch_size == 12
    np.testing.assert_array_equal(got.detections, dets)
    assert got.quads is not None
    np.testing.assert_array_equal(got.quads, quads)
    assert len(Result(5, "ok", dets).encode()) == len(data) - 2 * 32  # 24 bytes a box
    none = np.zeros((0, 6), np.float32)
    error = Result(6, "error", none, error_code="bad_image", error_message="cut")
    back = Result.decode(error.encode()[FRAME.size :])
    assert (back.outcome, back.error_code, back.error_message) == ("error", "bad_image", "cut")
    assert Result.decode(Result(1, "superseded", dets[:0]).encode()[5:]).outcome == "superseded"


def test_a_result_for_the_worker_to_post_carries_the_engines_outputs_exactly() -> None:
    byte_map = np.random.default_rng(1).integers(0, 256, (1, 352, 640), dtype=np.uint8)
    boxes = np.arange(24, dtype=np.float16).reshape(4, 6)
    raw = Submit(3, Record(0, 1, 1), 1, True, False, 0.5, None, None, raw=True)
    assert Submit.decode(raw.encode()[FRAME.size :]).raw
    plain = Submit(3, Record(0, 1, 1), 1, True, False, 0.5, None, None)
    assert not Submit.decode(plain.encode()[FRAME.size :]).raw
    none = np.zeros((0, 6), np.float32)
    small = [boxes, byte_map[0, :2]]  # under DEFLATE_FROM: as they are
    for outputs in ([byte_map], small):
        encoded = encode_outputs(outputs)
        assert (encoded[0] == 1) == (sum(o.nbytes for o in outputs) >= DEFLATE_FROM)
        got = Result.decode(Result(4, "ok", none, outputs=encoded).encode()[FRAME.size :])
        assert got.outputs is not None
        back = decode_outputs(got.outputs)
        assert [o.dtype for o in back] == [o.dtype for o in outputs]
        for a, b in zip(back, outputs, strict=True):
            np.testing.assert_array_equal(a, b)
    sparse = np.zeros((1, 352, 640), np.uint8)
    sparse[0, 100:120, 50:300] = 200
    assert len(encode_outputs([sparse])) < sparse.nbytes // 20  # a text map crosses small
    assert Result.decode(Result(4, "ok", none).encode()[FRAME.size :]).outputs is None
    with pytest.raises(ValueError, match="dtype complex64"):
        encode_outputs([np.zeros(2, np.complex64)])
