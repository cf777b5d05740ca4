"""The service's own CPU a frame, with the model's cost taken out: what a frame costs the
host beyond the engine, measured on any machine.

    python -m benchmarks.overhead [--cameras 8] [--fps 15] [--duration 30]
        [--rounds 3] [--variants "base:;uvloop:--set server.event_loop=uvloop"]
        [--json out.json]

On a GPU host the server's CPU a frame is what limits it (docs/benchmarks.md, issue 11's
figures: at 64 cameras on the H200 the per-frame Python of the ``loop`` and ``post`` roles
is most of it), but on a small CPU machine the real detector takes 100 times longer than
everything else and hides it. This bench serves the frames with a stand-in detector instead:
a few-node ONNX graph (the channels' mean through a steep sigmoid, dark pixels being
"text", thickened by a 9×9 max-pool so that each line of text becomes one region), written
to a temporary folder. Its output has the real detector's shape and, on the bench's frames,
gives as many boxes as the real one (2 a frame; checked before the runs, through the
service's own letterbox, normalisation and DB head, and reported as
``stand_in_boxes_a_frame``), so the service runs its DB head, tracker and replies on every
frame as it would. Everything else is the real path: ``edge-vision bench`` starts
``edge-vision serve`` with one worker and ``--cameras`` load-generator cameras send
1280×720 JPEGs over WebSockets at ``--fps``.

Each variant (``name:--set key=value ...``, variants separated by ``;``) is one server;
rounds alternate the variants' order, so a shared machine's noise falls on all of them. A
run in which a camera did not connect, report or keep its schedule fails the bench. Per
variant, the median over the rounds of each figure: the server's CPU per answered frame of
the ``loop`` role (the event loop) and of the service (``service_ms``: every thread role
but the engine's, ``ort``, whose cost here is the stand-in's), and the share of frames
answered; every round's CPU by role (``loop``, ``frame`` host decode and letterbox,
``post`` post-processing, ``ort``) is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from edge_vision.tools.bench.servers import medians, stop_process, write_report

#: Thread roles that run the engine itself (ONNX Runtime's runner thread): left out of
#: ``service_ms``.
ENGINE_ROLES = frozenset({"ort"})


def write_stand_in_model(path: Path) -> Path:
    """A DB-shaped detector that costs next to nothing: ``[N, 3, H, W]`` → ``[N, 1, H, W]``,
    sigmoid(-8 × channel mean - 4) of the normalised input (dark pixels score high), then a
    9×9 max-pool that joins a line's strokes into one region."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, "H", "W"])
    consts = [
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        helper.make_tensor("gain", TensorProto.FLOAT, [], [-8.0]),
        helper.make_tensor("bias", TensorProto.FLOAT, [], [-4.0]),
    ]
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
        helper.make_node("Mul", ["mean", "gain"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
        helper.make_node(
            "MaxPool", ["prob"], ["y"], kernel_shape=[9, 9], strides=[1, 1], pads=[4, 4, 4, 4]
        ),
    ]
    graph = helper.make_graph(nodes, "stand_in_db", [x], [y], initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8  # the oldest that opset 18 allows: older ONNX Runtimes read it
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def stand_in_boxes_a_frame(model: Path, frames: int = 4) -> float:
    """The detections a frame the stand-in gives on the bench's own frames (JPEG round
    trip, then the service's shape stage, the model and its DB head at the default
    confidence: :func:`~benchmarks.sizes.our_detections`): what the service's
    post-processing, tracker and replies carry."""
    import cv2
    import onnxruntime as ort

    from edge_vision.config import ModelConfig
    from edge_vision.model.spec import load_model_spec
    from edge_vision.tools.bench.frames import encode_jpegs, generated_frames
    from tests.support.reference import our_detections

    spec = load_model_spec(ModelConfig(path=model))
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    found = 0
    for jpeg in encode_jpegs(generated_frames(1280, 720, frames)):
        image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        if image is None:
            raise RuntimeError("a bench frame did not decode")
        frame = image.astype(np.uint8, copy=False)
        found += len(our_detections(session, spec, frame, spec.limits.target))
    return found / frames


def parse_variants(text: str) -> list[tuple[str, list[str]]]:
    """``"a:--set x=1;b:"`` → ``[("a", ["--set", "x=1"]), ("b", [])]``."""
    out: list[tuple[str, list[str]]] = []
    for part in text.split(";"):
        if not part.strip():
            continue
        name, _, sets = part.partition(":")
        out.append((name.strip(), shlex.split(sets)))
    if not out:
        raise ValueError("no variants")
    return out


def one_run(
    model: Path, name: str, sets: list[str], args: argparse.Namespace, out: Path
) -> dict[str, Any]:
    """One variant's load run through ``edge-vision bench``: its CPU a frame by role."""
    argv = [
        *(sys.executable, "-m", "edge_vision", "bench", "--model", str(model)),
        *("--cameras", str(args.cameras), "--fps", str(args.fps)),
        *("--duration", str(args.duration), "--resolution", "1280x720"),
        # One worker; the stand-in engine on one thread, so it leaves the cores to the rest.
        *("--set", "server.workers=1", "--set", "engine.onnxruntime.threads=1"),
        *(*sets, "--out", str(out), "--no-plots"),
    ]
    log = out.with_suffix(".log")
    with log.open("w") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
        try:
            proc.wait(args.duration + 300)
        except subprocess.TimeoutExpired:
            stop_process(proc, signal.SIGTERM, 30)  # the bench stops its server and cameras
            raise RuntimeError(f"{name}: edge-vision bench did not finish") from None
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"edge-vision bench failed ({name}):\n{tail}")
    run = json.loads((out / "results.json").read_text())["runs"][0]
    problems = [k for k in ("connect_errors", "cameras_stalled", "unanswered") if run.get(k)]
    if run["cameras_reported"] < run["cameras"]:
        problems.append("cameras_reported")
    answered = int(run["answered"])
    if answered == 0 or problems:
        raise RuntimeError(f"{name}: an incomplete run ({', '.join(problems) or 'no answers'})")
    roles = {
        role: seconds * 1000.0 / answered
        for role, seconds in run["server_cpu_by_thread_s"].items()
        if seconds > 0
    }
    return {
        "variant": name,
        "sets": sets,
        "sent": int(run["sent"]),
        "answered": answered,
        "answered_share": answered / max(int(run["sent"]), 1),
        "ms_by_role": roles,
        "loop_ms": roles.get("loop", 0.0),
        "service_ms": sum(ms for role, ms in roles.items() if role not in ENGINE_ROLES),
        "server_ms": sum(roles.values()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--cameras", type=int, default=8)
    ap.add_argument("--fps", type=float, default=15.0)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of load a run")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the variants alternating")
    ap.add_argument("--variants", default="base:", help='"name:--set k=v ...;name2:..."')
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    variants = parse_variants(args.variants)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="overhead-bench-") as tmp:
        model = write_stand_in_model(Path(tmp) / "stand_in_db.onnx")
        boxes = stand_in_boxes_a_frame(model)
        if boxes == 0:
            raise RuntimeError("the stand-in detector finds no box: post would run on nothing")
        print(f"the stand-in detector: {boxes:g} boxes a frame", flush=True)
        for r in range(args.rounds):
            for name, sets in variants if r % 2 == 0 else variants[::-1]:
                run = one_run(model, name, sets, args, Path(tmp) / f"{name}-{r}")
                runs.append({"round": r, "stand_in_boxes_a_frame": boxes, **run})
                roles = ", ".join(f"{k} {v:.2f}" for k, v in sorted(run["ms_by_role"].items()))
                print(
                    f"round {r} {name:10s} service {run['service_ms']:.2f} ms a frame "
                    f"({roles}), {100 * run['answered_share']:.1f} % answered",
                    flush=True,
                )
    summary = medians(runs, "variant", ("service_ms", "loop_ms", "server_ms", "answered_share"))
    print(f"\nmedian of {args.rounds} rounds, {args.cameras} cameras × {args.fps:g} fps:")
    for name, s in summary.items():
        print(
            f"  {name:10s} service {s['service_ms']:.2f} ms a frame, loop {s['loop_ms']:.2f}, "
            f"{100 * s['answered_share']:.1f} % answered"
        )
    if args.json:
        write_report(args.json, runs, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
