"""The ``edge-vision bench`` command: argument parsing, runs, table, JSON and plots."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ...common.settings import MODES
from ..args import add_config_args, config_from_args, setup_logging
from .servers import ONE_ADDRESS_SETS, SERVER_READY_S, Server, free_port, machine, serve_argv

DESCRIPTION = """``edge-vision bench``: load tests that measure what a camera client sees.

    edge-vision bench --cameras 4 --fps 15 --duration 30            # start a server, load it
    edge-vision bench --url ws://host:8080/ws --cameras 8 --fps 30  # load a running server
    edge-vision bench --engine-only                                 # the engine's ceiling
    edge-vision bench --compare --cameras 4 --fps 15 --duration 30  # ceiling, ours, baseline
    edge-vision bench --ceiling --cameras 32 --fps 30               # ceiling and ours
    edge-vision bench --cameras 1,2,4,8 --fps 15 --duration 20      # a sweep, with plots

Each run prints a table and writes ``results.json`` and PNG plots (latency distribution;
throughput and p99 against the number of cameras) to ``--out``.
"""

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="load-test a server (or the engine alone)",
        description=DESCRIPTION,
    )
    add_config_args(p)
    p.add_argument("--url", help="target a running server's /ws instead of starting one")
    p.add_argument("--cameras", default="4", help="cameras, or a sweep like 1,2,4,8")
    p.add_argument("--fps", type=float, default=15.0, help="frames per second per camera")
    p.add_argument(
        "--cameras-per-process",
        type=int,
        default=1,
        help="cameras one load-generator process drives (one event loop); 1: a process each",
    )
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per run")
    p.add_argument("--resolution", default="1280x720", help="frame size WxH")
    p.add_argument("--video", type=Path, help="a recorded video to take frames from")
    p.add_argument("--frames", type=int, default=60, help="distinct frames to cycle through")
    p.add_argument("--jpeg-quality", type=int, default=80, help="JPEG quality of the frames sent")
    p.add_argument(
        "--wire",
        choices=["binary", "json"],
        default="binary",
        help="frame messages: binary, or JSON with base64 (docs/protocol.md)",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default="latest",
        help="each camera's session mode: latest wins (drops counted) or every frame in order",
    )
    p.add_argument("--engine-only", action="store_true", help="only the engine ceiling")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also measure the engine ceiling and the textbook baseline in this run",
    )
    p.add_argument(
        "--ceiling", action="store_true", help="also measure the engine ceiling in this run"
    )
    p.add_argument("--engine-seconds", type=float, default=3.0, help="time per engine batch size")
    p.add_argument("--batches", help="engine-only batch sizes, e.g. 1,2,4,8 (default 1..max)")
    p.add_argument(
        "--engine-start-at",
        type=float,
        help="engine-only: start timing at this Unix time, after loading and graph capture, "
        "so engines in several processes are measured at the same time",
    )
    p.add_argument(
        "--server-ready-s",
        type=float,
        default=SERVER_READY_S,
        help="how long the server may take to warm up (engine.torch.compile takes minutes)",
    )
    p.add_argument(
        "--one-server",
        action="store_true",
        help="run every camera count against one server, started once, instead of a fresh "
        "server a count: its warm-up (workers, engine.torch.compile) is paid once, and each "
        "count meets the server as the count before left it",
    )
    p.add_argument("--out", type=Path, help="output folder (default bench-results/<time>)")
    p.add_argument("--no-plots", action="store_true", help="write results.json but no PNG plots")
    p.set_defaults(func=cmd_bench)


def _server_argv(args: argparse.Namespace, port: int) -> list[str]:
    argv = serve_argv(port)
    if args.config:
        argv += ["--config", str(args.config)]
    if args.model:
        argv += ["--model", str(args.model)]
    if args.engine:
        argv += ["--engine", args.engine]
    for s in args.set:
        argv += ["--set", s]
    for s in ONE_ADDRESS_SETS:  # every simulated camera connects from 127.0.0.1
        argv += ["--set", s]
    return argv


def load_run(
    name: str,
    url: str,
    jpegs: list[bytes],
    cameras: int,
    args: argparse.Namespace,
    server: Server | None,
) -> dict[str, Any]:
    from tqdm import tqdm

    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from .gpu import GpuSampler
    from .load import (
        CameraPlan,
        children_cpu_seconds,
        cpu_by_role,
        cpu_seconds,
        host_cpu_share,
        host_cpu_ticks,
        run_cameras,
        thread_cpu_seconds,
    )
    from .stats import summary, thirds_p99

    start_at = time.time() + 2.0 + 0.05 * cameras
    plans = [
        CameraPlan(
            i,
            url,
            jpegs,
            args.fps,
            args.duration,
            args.wire,
            args.mode,
            start_at + (i / max(cameras, 1)) / max(args.fps, 1e-9),
        )
        for i in range(cameras)
    ]
    tty = sys.stderr.isatty()
    bar = tqdm(
        total=int(args.duration),
        desc=f"{name} {cameras} cam",
        unit="s",
        file=sys.stderr,
        leave=False,
        disable=not tty,
    )
    last_line = [0.0]

    def tick(answered: int) -> None:
        t = time.time() - start_at
        if server is not None:
            server.sample(t)
        if tty:
            bar.n = int(min(max(t, 0), args.duration))
            bar.set_postfix(answered=answered)
            bar.refresh()
        elif t - last_line[0] >= 5:  # logs and CI: a line every 5 s instead of a bar
            last_line[0] = t
            print(
                f"{name} {cameras} cam: {max(t, 0):.0f}/{args.duration:.0f} s, {answered} answered",
                file=sys.stderr,
                flush=True,
            )

    if server is not None:
        server.rss = []  # this run's memory only (--one-server runs several on one server)
    server_pid = server.proc.pid if server and server.proc else None
    server_cpu0 = cpu_seconds(server_pid) if server_pid else None
    threads0 = thread_cpu_seconds(server_pid) if server_pid else {}
    host0 = host_cpu_ticks()
    cameras_cpu0 = children_cpu_seconds()
    gpu = GpuSampler.start()  # nvidia-smi's memory and utilisation, where it is
    results = run_cameras(plans, on_tick=tick, cameras_per_process=args.cameras_per_process)
    gpu_fields = gpu.stop()
    cameras_cpu = children_cpu_seconds() - cameras_cpu0
    host_share = host_cpu_share(host0, host_cpu_ticks())
    by_role = cpu_by_role(threads0, thread_cpu_seconds(server_pid)) if server_pid else {}
    server_cpu1 = cpu_seconds(server_pid) if server_pid else None
    server_cpu = (
        server_cpu1 - server_cpu0 if server_cpu0 is not None and server_cpu1 is not None else None
    )
    bar.close()
    lat = [x for r in results for x in r.latencies_ms]
    times = [x for r in results for x in r.sent_at_s]
    answered = sum(r.answered for r in results)
    # Frames per second over the time answers actually took to arrive: a server that falls
    # behind keeps answering long after the cameras stop, and that time counts.
    finished = max((s + lt / 1000.0 for s, lt in zip(times, lat, strict=True)), default=0.0)
    span = max(args.duration, finished)
    stages: dict[str, dict[str, float]] = {}
    for key in (
        "decode_ms",
        # the letterbox; with GPU decode, also the wait for the decoder's stream
        "shape_ms",
        "queue_ms",
        "batch_wait_ms",
        "infer_ms",
        "post_ms",
        "server_ms",
        "batch_size",
    ):
        vals = [t[key] for r in results for t in r.server_timing if key in t]
        if vals:
            stages[key] = summary(vals)
    rss = server.rss if server else []
    rss_after5 = [m for t, m in rss if t >= 5.0]
    return {
        "name": name,
        "cameras": cameras,
        "fps_per_camera": args.fps,
        "duration_s": args.duration,
        "mode": args.mode,
        "wire": args.wire,
        "sent": sum(r.sent for r in results),
        "answered": answered,
        "dropped": sum(r.dropped for r in results),
        "errors": sum(r.errors for r in results),
        "unanswered": sum(r.unanswered for r in results),
        "duplicates": sum(r.duplicates for r in results),
        "events_by_rule": dict(
            sum((collections.Counter(r.events_by_rule) for r in results), collections.Counter())
        ),
        "connect_errors": [r.connect_error for r in results if r.connect_error],
        "cameras_reported": len(results),
        "cameras_stalled": sum(r.send_stalled for r in results),
        "answered_per_s": answered / span,
        "answer_span_s": span,
        "per_camera_answered_fps": [r.answered / span for r in results],
        "latency_ms": summary(lat),
        "p99_by_third_ms": thirds_p99(times, lat),
        "server_stages_ms": stages,
        # CPU of the server's processes (all workers) and of the camera processes while
        # the cameras ran, and the server's per 1,000 answered frames.
        "server_cpu_s": server_cpu,
        "server_cpu_s_per_1000_answered": (
            1000 * server_cpu / answered if server_cpu is not None and answered else None
        ),
        "cameras_cpu_s": cameras_cpu,
        # The server's CPU seconds by thread role (edge_vision/common/threads.py; "loop": each
        # worker's event loop), and the whole machine's CPU by kind while the cameras ran:
        # which stage takes the cores, and whether any were left.
        "server_cpu_by_thread_s": {k: round(v, 2) for k, v in by_role.items()},
        "host_cpu_share": {k: round(v, 4) for k, v in host_share.items()},
        "cameras_per_process": args.cameras_per_process,
        **gpu_fields,  # gpu_mem_mib (the node's GPUs), gpu_util_pct: absent without a GPU
        "rss_mib": {
            "after_5s_min": min(rss_after5, default=float("nan")),
            "after_5s_max": max(rss_after5, default=float("nan")),
            "samples": rss,
        },
        "_latencies": lat,
    }


def _print_table(runs: list[dict[str, Any]], engine: dict[str, Any] | None) -> None:
    print()
    if engine is not None:
        print(
            "engine only (" + engine["engine"]["kind"] + f", input {engine['input'][1]}x"
            f"{engine['input'][0]}):"
        )
        print(f"  {'batch':>5} {'frames/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'pipelined f/s':>14}")
        for r in engine["rows"]:
            s = r["serial"]
            print(
                f"  {r['batch']:>5} {s['frames_per_s']:>9.1f} {s['batch_ms']['p50']:>8.1f} "
                f"{s['batch_ms']['p99']:>8.1f} {r['pipelined']['frames_per_s']:>14.1f}"
            )
    if runs:
        print(
            f"\n{'run':<10} {'cams':>4} {'sent':>6} {'answered/s':>10} {'dropped':>7} "
            f"{'err':>4} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7}  p99 by third (ms)"
        )
        for r in runs:
            lat = r["latency_ms"]
            thirds = " / ".join(f"{v:.0f}" for v in r["p99_by_third_ms"])
            print(
                f"{r['name']:<10} {r['cameras']:>4} {r['sent']:>6} {r['answered_per_s']:>10.1f} "
                f"{r['dropped']:>7} {r['errors']:>4} {lat['p50']:>7.1f} {lat['p95']:>7.1f} "
                f"{lat['p99']:>7.1f}  {thirds}"
            )
        for r in runs:
            if r.get("server_cpu_s") is not None:
                per_k = r["server_cpu_s_per_1000_answered"]
                print(
                    f"{r['name']} {r['cameras']} cam: server CPU {r['server_cpu_s']:.1f} s "
                    f"({per_k:.2f} s per 1,000 answered), cameras CPU {r['cameras_cpu_s']:.1f} s"
                    if per_k is not None
                    else f"{r['name']}: server CPU {r['server_cpu_s']:.1f} s, nothing answered"
                )
            roles = r.get("server_cpu_by_thread_s") or {}
            if roles:
                print(
                    "  by thread: "
                    + ", ".join(f"{k} {v:.1f} s" for k, v in list(roles.items())[:8])
                )
            host = r.get("host_cpu_share") or {}
            if host:
                print(
                    f"  machine: {100 * host['busy']:.0f} % of {host['cores']:.0f} cores busy "
                    f"(user {100 * host.get('user', 0):.0f} %, system "
                    f"{100 * host.get('system', 0):.0f} %, "
                    f"softirq {100 * host.get('softirq', 0):.0f} %)"
                )
        for r in runs:
            for problem in _run_problems(r):
                print(f"{r['name']}: {problem}")
    print()


def _run_problems(run: dict[str, Any]) -> list[str]:
    """What makes a run's row incomplete, in words for the table's reader."""
    problems = []
    if run["cameras_reported"] < run["cameras"]:
        missing = run["cameras"] - run["cameras_reported"]
        problems.append(f"{missing} of {run['cameras']} cameras did not report (crashed or hung)")
    if run["cameras_stalled"]:
        problems.append(
            f"{run['cameras_stalled']} cameras could not send on schedule: the server stopped "
            "reading; frames not written by the end were not counted as sent"
        )
    if run["connect_errors"]:
        problems.append(
            f"connect errors: {run['connect_errors'][0]} (x{len(run['connect_errors'])})"
        )
    if run["unanswered"]:
        problems.append(f"{run['unanswered']} frames sent but never answered or dropped")
    return problems


def _plots(out: Path, runs: list[dict[str, Any]]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        lat = np.sort(np.asarray(r["_latencies"]))
        if lat.size:
            ax.plot(lat, np.linspace(0, 1, lat.size), label=f"{r['name']} ({r['cameras']} cam)")
    ax.set_xlabel("end-to-end latency at the client (ms)")
    ax.set_ylabel("fraction of answered frames")
    ax.set_xscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(out / "latency_cdf.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    by_name: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_name.setdefault(r["name"], []).append(r)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rs in by_name.items():
        rs = sorted(rs, key=lambda r: r["cameras"])
        cams = [r["cameras"] for r in rs]
        a1.plot(cams, [r["answered_per_s"] for r in rs], "o-", label=name)
        a2.plot(cams, [r["latency_ms"]["p99"] for r in rs], "o-", label=name)
    a1.set_xlabel("cameras")
    a1.set_ylabel("frames answered per second")
    a2.set_xlabel("cameras")
    a2.set_ylabel("client p99 latency (ms)")
    for a in (a1, a2):
        a.grid(True, alpha=0.3)
        a.legend()
    fig.tight_layout()
    paths.append(out / "throughput_p99_vs_cameras.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def cmd_bench(args: argparse.Namespace) -> int:
    if args.one_server and args.compare:
        # the baseline would be timed beside a resident server of ours
        print("bench: --one-server and --compare cannot go together", file=sys.stderr)
        return 2
    config = config_from_args(args)
    setup_logging(config.logging.level)
    # SIGTERM (a `timeout`, a device call's limit) unwinds like Ctrl-C: the server and the
    # camera processes this started are stopped on the way out, and what finished is kept.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _bench(args, config)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _bench(args: argparse.Namespace, config: Any) -> int:
    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from ...model.spec import load_model_spec
    from .frames import encode_jpegs, generated_frames, video_frames

    width, height = (int(v) for v in args.resolution.lower().split("x"))
    out = args.out or Path("bench-results") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "argv": sys.argv,
        "config": config.model_dump(mode="json"),
    }
    engine_res = None
    if args.engine_only or args.compare or args.ceiling:
        spec = load_model_spec(config.model)
        sizes = [int(b) for b in args.batches.split(",")] if args.batches else None
        engine_res = asyncio.run(
            _engine_ceiling(
                spec, config, width, height, args.engine_seconds, sizes, args.engine_start_at
            )
        )
        report["engine_only"] = engine_res
        _write_results(out, report, [], engine_res, partial=True)
    runs: list[dict[str, Any]] = []
    if not args.engine_only:
        if args.video:
            rgb = video_frames(args.video, width, height, args.frames)
        else:
            rgb = generated_frames(width, height, args.frames)
        jpegs = encode_jpegs(rgb, args.jpeg_quality)
        report["frames"] = {
            "count": len(jpegs),
            "resolution": [width, height],
            "mean_jpeg_kb": sum(map(len, jpegs)) / len(jpegs) / 1024,
            "source": str(args.video or "generated"),
        }
        cams = [int(c) for c in str(args.cameras).split(",")]

        def add(run: dict[str, Any]) -> None:
            # On disk as each run ends: a bench stopped by a timeout (a device call's
            # limit) keeps the counts it completed.
            runs.append(run)
            _write_results(out, report, runs, engine_res, partial=True)

        with contextlib.ExitStack() as shared:
            # --one-server: the server every count runs against, started once
            one = None
            if args.one_server and not args.url:
                one = shared.enter_context(_ours(args, out))
            for n in cams:
                if args.url:
                    add(load_run("target", args.url, jpegs, n, args, None))
                    continue
                if one is not None:
                    add(load_run("edge_vision", one.ws_url, jpegs, n, args, one))
                else:
                    with _ours(args, out) as srv:
                        add(load_run("edge_vision", srv.ws_url, jpegs, n, args, srv))
                if args.compare:
                    port = free_port()
                    threads = str(config.engine.onnxruntime.threads or "")
                    argv = [
                        sys.executable,
                        "-m",
                        "edge_vision.tools.bench.baseline",
                        "--port",
                        str(port),
                    ]
                    if args.model:
                        argv += ["--model", str(args.model)]
                    if threads:
                        argv += ["--threads", threads]
                    with Server(argv, port, out / "baseline.log", ready_path=None) as srv:
                        add(load_run("baseline", srv.ws_url, jpegs, n, args, srv))
    report = _write_results(out, report, runs, engine_res, partial=False)
    _print_table(runs, engine_res)
    for line in report["ratios"].get("lines", []):
        print(line)
    if runs and not args.no_plots:
        for p in _plots(out, runs):
            print(f"plot: {p}")
    print(f"results: {out / 'results.json'}")
    return 0


def _ours(args: argparse.Namespace, out: Path) -> Server:
    """An ``edge-vision serve`` of this bench's settings on a free port (not started yet)."""
    port = free_port()
    return Server(_server_argv(args, port), port, out / "server.log", ready_s=args.server_ready_s)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # Once: a second SIGTERM must not cut the clean-up short (a server half stopped).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _write_results(
    out: Path,
    report: dict[str, Any],
    runs: list[dict[str, Any]],
    engine_res: dict[str, Any] | None,
    *,
    partial: bool,
) -> dict[str, Any]:
    """``out/results.json`` with the runs so far; ``partial``: more camera counts were to
    come (``"partial": true`` in the file, so a reader knows the bench did not finish)."""
    done = dict(report)
    done["runs"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs]
    done["ratios"] = _ratios(runs, engine_res)
    if partial:
        done["partial"] = True
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(done, indent=2, default=str))
    tmp.replace(out / "results.json")  # never a half-written file
    return done


async def _engine_ceiling(
    spec: Any,
    config: Any,
    width: int,
    height: int,
    seconds: float,
    sizes: list[int] | None,
    start_at: float | None = None,
) -> dict[str, Any]:
    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from .engine_only import measure_engine

    return await measure_engine(spec, config, width, height, seconds, sizes, start_at=start_at)


#: A camera count "holds" while at least this share of its frames is answered (issue 11's
#: push toward the engine's ceiling).
PUSH_ANSWERED = 0.95


def _ratios(runs: list[dict[str, Any]], engine: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"lines": []}
    ours = [r for r in runs if r["name"] in ("edge_vision", "target")]
    base = {r["cameras"]: r for r in runs if r["name"] == "baseline"}
    if engine is not None:
        best = max(r["pipelined"]["frames_per_s"] for r in engine["rows"])
        single = engine["rows"][0]["serial"]["batch_ms"]["p50"]
        out["engine_ceiling_fps"] = best
        out["engine_single_frame_ms"] = single
        for r in ours:
            ratio = r["answered_per_s"] / best
            p99x = r["latency_ms"]["p99"] / single
            out["lines"].append(
                f"{r['cameras']} cam: served {r['answered_per_s']:.1f} frames/s = "
                f"{100 * ratio:.0f}% of the engine ceiling {best:.1f}; client p99 "
                f"{r['latency_ms']['p99']:.0f} ms = {p99x:.2f}x the engine's single-frame "
                f"{single:.1f} ms"
            )
        # The push toward the engine: the most cameras still answered >= 95 % of what they
        # sent, and what they got as a share of the ceiling measured in this same run.
        kept = [r for r in ours if r["sent"] and r["answered"] >= PUSH_ANSWERED * r["sent"]]
        if kept:
            top = max(kept, key=lambda r: r["cameras"])
            share = top["answered_per_s"] / best
            out["push"] = {
                "cameras": top["cameras"],
                "answered_per_s": top["answered_per_s"],
                "fraction_of_ceiling": share,
            }
            out["lines"].append(
                f"push: {top['cameras']} cameras is the most run that stayed >= "
                f"{100 * PUSH_ANSWERED:.0f}% answered; {top['answered_per_s']:.1f} frames/s = "
                f"{share:.2f} of the engine ceiling"
            )
    for r in ours:
        b = base.get(r["cameras"])
        if b:
            out["lines"].append(
                f"{r['cameras']} cam: baseline p99 {b['latency_ms']['p99']:.0f} ms (by third "
                f"{' / '.join(f'{v:.0f}' for v in b['p99_by_third_ms'])}) vs ours "
                f"{r['latency_ms']['p99']:.0f} ms (by third "
                f"{' / '.join(f'{v:.0f}' for v in r['p99_by_third_ms'])}): "
                f"{b['latency_ms']['p99'] / max(r['latency_ms']['p99'], 1e-9):.1f}x"
            )
    return out
