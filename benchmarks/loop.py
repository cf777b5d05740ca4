"""Event-loop bench: the server's CPU per WebSocket message with each ``server.event_loop``.

    python -m benchmarks.loop [--clients 16] [--messages 400] [--bytes 90000]
        [--rounds 3] [--loops asyncio,uvloop] [--json out.json]

A serving worker runs its sockets, callbacks and timers on one interpreter, beside its
decode, post-processing and tracking (docs/benchmarks.md: on a GPU host the server's CPU
a frame is what limits it). This bench isolates that part: for each loop,
``edge-vision serve`` starts with its test echo route (``server.test_echo_route``, the
production WebSocket settings), ``--clients`` connections in one client process each send
``--messages`` binary messages of ``--bytes`` (a camera frame's size) and wait for each
echo, and the server's CPU seconds (user + system, from /proc) are divided by the messages
it echoed (/proc counts in 10 ms ticks: a round wants seconds of the server's CPU, as
the defaults give). Rounds alternate the loops, so a shared machine's noise falls on both;
the median round is reported, with messages per second.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

from edge_vision.tools.bench.load import cpu_seconds
from edge_vision.tools.bench.servers import Server, free_port, medians, serve_argv, write_report


async def _drive(url: str, clients: int, messages: int, size: int) -> int:
    """``clients`` connections, each sending ``messages`` messages and awaiting each echo."""
    import aiohttp

    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)

    async def one(session: aiohttp.ClientSession) -> int:
        async with session.ws_connect(url, max_msg_size=0) as ws:
            for _ in range(messages):
                await ws.send_bytes(payload)
                msg = await ws.receive()
                if msg.type is not aiohttp.WSMsgType.BINARY or len(msg.data) != size:
                    raise RuntimeError(f"echo broke: {msg.type}")
            return messages

    async with aiohttp.ClientSession() as session:
        done = await asyncio.gather(*(one(session) for _ in range(clients)))
    return sum(done)


def _client(url: str, clients: int, messages: int, size: int, out: Any) -> None:
    out.put(asyncio.run(_drive(url, clients, messages, size)))


def one_round(loop: str, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """One loop's run against a fresh server: its CPU per message and messages per second."""
    port = free_port()
    sets = ["server.test_echo_route=true", f"server.event_loop={loop}"]
    argv = [*serve_argv(port), *(arg for s in sets for arg in ("--set", s))]
    with Server(argv, port, logs / f"server-{loop}.log") as server:
        assert server.proc is not None
        url = f"ws://127.0.0.1:{port}/test/echo"
        spawn = multiprocessing.get_context("spawn")
        results: Any = spawn.Queue()
        client = spawn.Process(
            target=_client, args=(url, args.clients, args.messages, args.bytes, results)
        )
        cpu0, t0 = cpu_seconds(server.proc.pid), time.perf_counter()
        client.start()
        echoed = int(results.get(timeout=600))
        wall = time.perf_counter() - t0
        cpu1 = cpu_seconds(server.proc.pid)
        client.join(30)
    if cpu0 is None or cpu1 is None:
        raise RuntimeError("the server's CPU time could not be read from /proc")
    return {
        "loop": loop,
        "messages": echoed,
        "server_cpu_s": cpu1 - cpu0,
        "server_cpu_us_per_message": (cpu1 - cpu0) / echoed * 1e6,
        "messages_per_s": echoed / wall,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--clients", type=int, default=16, help="WebSocket connections")
    ap.add_argument("--messages", type=int, default=400, help="messages each connection sends")
    ap.add_argument("--bytes", type=int, default=90_000, help="bytes a message (a JPEG frame)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the loops alternating")
    ap.add_argument("--loops", default="asyncio,uvloop", help="server.event_loop values")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    loops = [x.strip() for x in args.loops.split(",") if x.strip()]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="loop-bench-") as tmp:
        for r in range(args.rounds):
            for loop in loops if r % 2 == 0 else loops[::-1]:
                run = one_round(loop, args, Path(tmp))
                runs.append({"round": r, **run})
                print(
                    f"round {r} {loop:8s} {run['server_cpu_us_per_message']:7.1f} µs server CPU "
                    f"a message, {run['messages_per_s']:7.0f} messages/s",
                    flush=True,
                )
    summary = medians(runs, "loop", ("server_cpu_us_per_message", "messages_per_s"))
    print(f"\nmedian of {args.rounds} rounds, {args.clients} clients × {args.messages} messages")
    print(f"of {args.bytes:,} bytes:")
    for loop, s in summary.items():
        print(
            f"  {loop:8s} {s['server_cpu_us_per_message']:7.1f} µs server CPU a message, "
            f"{s['messages_per_s']:7.0f} messages/s"
        )
    if args.json:
        write_report(args.json, runs, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
