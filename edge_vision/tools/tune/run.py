"""One ``edge-vision tune`` run: the engine's ceiling, the trials against the real server,
and what it writes (the config, the report, the plot)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

from ...config import Config
from ...engines.choice import engine_choice_of, resolve_engine
from ...errors import ConfigError, EdgeVisionError
from ..args import config_from_args, setup_logging
from ..bench.command import load_run
from ..bench.frames import encode_jpegs, generated_frames
from ..bench.servers import ONE_ADDRESS_SETS, Server, free_port, machine, serve_argv
from .knobs import current, knobs_for
from .search import Knob, Outcome, Target, Trial, default_target, rank, search

#: Seconds a server takes to start and warm up, guessed before the first trial is timed.
FIRST_TRIAL_OVERHEAD_S = 15.0


def tune(args: argparse.Namespace) -> int:
    setup_logging("WARNING")
    base = config_from_args(args)
    config = resolve_engine(base)
    width, height = (int(v) for v in args.resolution.lower().split("x"))
    out_dir = args.out.parent / (args.out.stem + "-tune")
    out_dir.mkdir(parents=True, exist_ok=True)
    choice = engine_choice_of(config)
    print(f"engine: {choice['kind']} ({choice['reason']})", flush=True)

    ceiling, frame_ms = _ceiling(args, out_dir, width, height)
    print(
        f"the engine alone: {ceiling:.0f} frames/s at {width}x{height}, "
        f"one frame in {frame_ms:.0f} ms",
        flush=True,
    )
    target, notes = default_target(ceiling, frame_ms, args.cameras, args.fps, args.p99_ms)
    for note in notes:
        print(note, flush=True)
    print(
        f"load: {target.cameras} cameras x {target.fps:g} fps, p99 <= {target.p99_ms:g} ms; "
        f"budget {args.budget_s:.0f} s, {args.trial_s:g} s a trial",
        flush=True,
    )
    sizes = tuple(int(s) for s in args.input_sizes.split(",")) if args.input_sizes else ()
    knobs = knobs_for(config, os.cpu_count() or 1, sizes)
    jpegs = encode_jpegs(generated_frames(width, height, 30), 80)
    live = LiveTrial(_server_args(args), target, args.trial_s, jpegs, out_dir)
    bar = tqdm(
        total=1 + sum(len(k.values) - 1 for k in knobs),
        unit="trial",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),  # logs and CI: a line a trial instead
    )

    def said(trial: Trial, best: Trial) -> None:
        bar.update(1)
        bar.write(f"  {_describe(trial, target)}")

    outcome = search(
        target,
        current(config, knobs),
        knobs,
        live,
        args.budget_s,
        trial_cost_s=args.trial_s + FIRST_TRIAL_OVERHEAD_S,
        clock=time.monotonic,
        ceiling_fps=ceiling,
        on_trial=said,
    )
    bar.close()
    print(f"stopped: {outcome.stopped}", flush=True)
    report = _report(args, target, config, knobs, outcome, ceiling)
    (out_dir / "tune.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out_dir / "report.md").write_text(_table(outcome, target) + "\n")
    print(_table(outcome, target))
    with contextlib.suppress(ImportError):
        print(f"plot: {_plot(out_dir / 'trials.png', outcome, target)}")
    if outcome.best is None:
        print("no config written: nothing was measured that serves this load", flush=True)
        return 1
    args.out.write_text(tuned_yaml(args, target, choice, knobs, outcome))
    held = "holds" if outcome.best.holds(target) else "does NOT hold"
    print(f"wrote {args.out} (it {held} the load); serve it: edge-vision serve --config {args.out}")
    return 0 if outcome.best.holds(target) else 1


def _server_args(args: argparse.Namespace) -> list[str]:
    """The user's own config flags, passed on to every trial's server."""
    argv: list[str] = []
    if args.config:
        argv += ["--config", str(args.config)]
    if args.model:
        argv += ["--model", str(args.model)]
    if args.engine:
        argv += ["--engine", args.engine]
    for s in args.set:
        argv += ["--set", s]
    return argv


def _ceiling(args: argparse.Namespace, out: Path, width: int, height: int) -> tuple[float, float]:
    """The engine's best frames a second (at any batch) and its median time for a batch of
    one frame (ms), measured by ``edge-vision bench --engine-only`` in a process of its own (a
    GPU engine's memory and context must not stay in this one while the trials run)."""
    argv = [sys.executable, "-m", "edge_vision", "bench", "--engine-only", *_server_args(args)]
    argv += ["--resolution", f"{width}x{height}", "--engine-seconds", "2"]
    argv += ["--out", str(out / "ceiling"), "--no-plots"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    results = out / "ceiling" / "results.json"
    if done.returncode != 0 or not results.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EdgeVisionError(f"could not measure the engine alone: {tail[0]}")
    rows = json.loads(results.read_text())["engine_only"]["rows"]
    one = min(rows, key=lambda row: int(row["batch"]))
    return (
        max(float(row["pipelined"]["frames_per_s"]) for row in rows),
        float(one["serial"]["batch_ms"]["p50"]),
    )


class LiveTrial:
    """One trial: a fresh ``edge-vision serve`` with the trial's settings, the cameras for
    ``seconds``, and what they saw."""

    def __init__(
        self, argv: list[str], target: Target, seconds: float, jpegs: list[bytes], out: Path
    ) -> None:
        self.argv, self.target, self.seconds, self.jpegs, self.out = (
            argv,
            target,
            seconds,
            jpegs,
            out,
        )
        self.count = 0

    def __call__(self, settings: Mapping[str, Any]) -> Trial:
        self.count += 1
        port = free_port()
        argv = serve_argv(port) + self.argv
        for key, value in settings.items():
            argv += ["--set", f"{key}={value}"]
        for s in ONE_ADDRESS_SETS:
            argv += ["--set", s]
        load = argparse.Namespace(
            fps=self.target.fps,
            duration=self.seconds,
            wire="binary",
            mode="latest",
            cameras_per_process=max(1, math.ceil(self.target.cameras / 8)),
        )
        began = time.monotonic()
        log = self.out / f"trial-{self.count}.log"
        try:
            with Server(argv, port, log) as srv:
                run = load_run("tune", srv.ws_url, self.jpegs, self.target.cameras, load, srv)
        except (RuntimeError, TimeoutError, OSError) as e:  # a setting the server refused
            print(f"  trial {self.count} did not start: {e}", file=sys.stderr)
            return Trial(settings, 0.0, math.inf, None, time.monotonic() - began)
        sent = max(1, int(run["sent"]))
        return Trial(
            settings,
            float(run["answered"]) / sent,
            float(run["latency_ms"].get("p99", math.inf)),
            run["server_cpu_s_per_1000_answered"],
            time.monotonic() - began,
        )


def _describe(trial: Trial, target: Target) -> str:
    cpu = f", {trial.cpu_per_1000:.2f} CPU-s/1000" if trial.cpu_per_1000 is not None else ""
    mark = "holds" if trial.holds(target) else "short"
    settings = ", ".join(f"{k}={v}" for k, v in trial.settings.items())
    return (
        f"{mark}: {100 * trial.answered:.2f} % answered, p99 {trial.p99_ms:.0f} ms{cpu} "
        f"({settings}; {trial.seconds:.0f} s)"
    )


def _table(outcome: Outcome, target: Target) -> str:
    keys = sorted({k for t in outcome.trials for k in t.settings})
    head = ["#", *keys, "answered %", "p99 ms", "server CPU-s / 1000", "holds"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for i, t in enumerate(outcome.trials, 1):
        best = " (best)" if t is outcome.best else ""
        cpu = f"{t.cpu_per_1000:.2f}" if t.cpu_per_1000 is not None else "-"
        cells = [f"{i}{best}", *(str(t.settings.get(k, "")) for k in keys)]
        cells += [f"{100 * t.answered:.2f}", f"{t.p99_ms:.1f}", cpu]
        cells.append("yes" if t.holds(target) else "no")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _plot(path: Path, outcome: Outcome, target: Target) -> Path:
    import matplotlib  # optional: the bench extra

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = list(range(1, len(outcome.trials) + 1))
    ax.plot(xs, [min(t.p99_ms, 10 * target.p99_ms) for t in outcome.trials], "o-", label="p99")
    ax.axhline(target.p99_ms, ls="--", color="grey", label="p99 target")
    ax.set_xlabel("trial")
    ax.set_ylabel("p99 ms")
    ax2 = ax.twinx()
    ax2.plot(xs, [100 * t.answered for t in outcome.trials], "s-", color="tab:green")
    ax2.set_ylabel("answered %")
    ax.set_title(f"edge-vision tune: {target.cameras} cameras x {target.fps:g} fps")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _report(
    args: argparse.Namespace,
    target: Target,
    config: Config,
    knobs: list[Knob],
    outcome: Outcome,
    ceiling: float,
) -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "argv": sys.argv,
        "target": {"cameras": target.cameras, "fps": target.fps, "p99_ms": target.p99_ms},
        "engine_choice": engine_choice_of(config),
        "engine_ceiling_fps": ceiling,
        "knobs": [{"key": k.key, "values": list(k.values), "why": k.why} for k in knobs],
        "trials": [
            {
                "settings": dict(t.settings),
                "answered": t.answered,
                "p99_ms": t.p99_ms,
                "cpu_per_1000": t.cpu_per_1000,
                "seconds": t.seconds,
                "holds": t.holds(target),
            }
            for t in outcome.trials
        ],
        "best": dict(outcome.best.settings) if outcome.best else None,
        "stopped": outcome.stopped,
    }


def tuned_yaml(
    args: argparse.Namespace,
    target: Target,
    choice: Mapping[str, Any],
    knobs: list[Knob],
    outcome: Outcome,
) -> str:
    """The config ``serve --config`` takes: the user's own file and flags, with the best
    trial's settings, each commented with what was tried."""
    if outcome.best is None:
        raise ConfigError("no trial to write a config from")
    tree: dict[str, Any] = {}
    if args.config:
        loaded = yaml.safe_load(Path(args.config).read_text()) or {}
        tree = loaded if isinstance(loaded, dict) else {}
    overrides = {**_flag_settings(args), "engine.kind": choice["kind"], **outcome.best.settings}
    notes: dict[str, str] = {"engine.kind": f"auto chose it: {choice['reason']}"}
    for knob in knobs:
        best_by_value: dict[str, Trial] = {}
        for t in outcome.trials:
            value = repr(t.settings.get(knob.key))
            if value not in best_by_value or rank(t, target) > rank(best_by_value[value], target):
                best_by_value[value] = t
        tried = [
            f"{t.settings.get(knob.key)}: {100 * t.answered:.1f} % answered, p99 {t.p99_ms:.0f} ms"
            for t in best_by_value.values()
        ]
        notes[knob.key] = f"{knob.why}. Tried (best trial with each): {'; '.join(tried)}"
    for key, value in overrides.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    best = outcome.best
    cpu = f", {best.cpu_per_1000:.2f} server CPU-s per 1,000 frames" if best.cpu_per_1000 else ""
    head = [
        f"# edge-vision tune, {time.strftime('%Y-%m-%d %H:%M %Z')}, on {platform.node()}",
        f"# load: {target.cameras} cameras x {target.fps:g} fps, p99 <= {target.p99_ms:g} ms; "
        f"{len(outcome.trials)} trials ({outcome.stopped})",
        f"# best: {100 * best.answered:.2f} % answered, p99 {best.p99_ms:.1f} ms{cpu}",
        "# serve it: edge-vision serve --config THIS_FILE",
    ]
    return "\n".join(head) + "\n" + _yaml_with_notes(tree, notes)


def _flag_settings(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in args.set:
        key, _, value = item.partition("=")
        out[key.strip()] = yaml.safe_load(value) if value else ""
    if args.model:
        out["model.path"] = str(args.model)
    return out


def _yaml_with_notes(tree: Mapping[str, Any], notes: Mapping[str, str], prefix: str = "") -> str:
    lines: list[str] = []
    indent = "  " * prefix.count(".") if prefix else ""
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        note = notes.get(dotted)
        if note:
            width = max(40, 96 - len(indent))
            lines += [f"{indent}# {part}" for part in textwrap.wrap(note, width)]
        if isinstance(value, Mapping):
            lines.append(f"{indent}{key}:")
            lines.append(_yaml_with_notes(value, notes, dotted + ".").rstrip("\n"))
        else:
            scalar = yaml.safe_dump(value, default_flow_style=True).strip()
            scalar = scalar.removesuffix("\n...").removesuffix("...").strip()
            lines.append(f"{indent}{key}: {scalar}")
    return "\n".join(lines) + "\n"
