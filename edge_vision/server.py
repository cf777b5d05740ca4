"""The aiohttp application: routes, typed app state and lifecycle. A thin shell.

Routes: ``GET /ws`` (the protocol, docs/protocol.md), ``GET /healthz`` (process alive),
``GET /readyz`` (engine loaded and warmed up; 503 before), ``GET /metrics`` (Prometheus),
``GET /api/sessions`` and ``GET /api/nodes`` (admin, bearer token when configured),
``POST /api/engine/retry`` (try the configured engine again after a degrade) and the
overlay page at ``/``.

Start-up: the HTTP port opens at once (so /healthz answers), the engine loads and warms
up in the background, and /ws and /readyz turn ready after warm-up. Shutdown (SIGTERM):
stop accepting, let frames in flight finish for ``server.shutdown_grace_s``, close every
socket with 1001 and a resume hint, remove this node's keys from the state store.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import WSCloseCode, web

from . import reply
from .aio import cancel_and_wait, with_timeout
from .config import Config
from .connection import Connection, ConnectionContext, ConnectionDone
from .errors import EdgeVisionError, UnsupportedProtocol
from .infer import InferenceService
from .metrics import Metrics
from .models import ModelSpec, load_model_spec
from .pipeline import FramePipeline
from .receive import PROTOCOL_VERSION
from .session import MAX_FORWARDED_FOR, Session, new_session
from .state import StateKeeper, create_store
from .versions import BASE_FEATURES, choose_protocol, refusal

log = logging.getLogger(__name__)

CONFIG = web.AppKey("config", Config)
METRICS = web.AppKey("metrics", Metrics)
SERVICE = web.AppKey("service", InferenceService)
PIPELINE = web.AppKey("pipeline", FramePipeline)
KEEPER = web.AppKey("keeper", StateKeeper)
CONNECTIONS = web.AppKey("connections", dict[str, Connection])
NODE = web.AppKey("node", dict[str, Any])
STARTUP: web.AppKey[asyncio.Task[None]] = web.AppKey("startup")
STATE = web.AppKey("state", dict[str, Any])
CONNECTION_CTX = web.AppKey("connection_ctx", ConnectionContext)
#: Optional features this node has, announced in hello (docs/protocol.md, "Versions"): a
#: feature turned on by config is appended in create_app.
FEATURES = web.AppKey("features", list[str])

REPO_WEB = Path(__file__).resolve().parent.parent / "web"


def _node_id(config: Config) -> str:
    return config.state.node_id or f"{socket.gethostname()}-{os.getpid()}"


def _require_admin(request: web.Request) -> None:
    token = request.app[CONFIG].server.admin_token
    if token and request.headers.get("Authorization", "") != f"Bearer {token}":
        raise web.HTTPUnauthorized(text="admin token required (Authorization: Bearer ...)\n")


def _engine_json(service: InferenceService) -> dict[str, Any]:
    st = service.status
    return {
        "configured": st.configured,
        "active": st.active,
        "ready": st.ready,
        "degraded": st.degraded,
        "reason": st.reason,
        "warmup_s": st.warmup_s,
        "head": service.spec.head,
        **st.details,
    }


# -- handlers ---------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    app = request.app
    service, keeper = app[SERVICE], app[KEEPER]
    startup = app[STATE].get("startup_error")
    unhealthy = await service.health()
    # With server.workers > 1 any worker may answer this probe, and the kernel hands new
    # sockets to any of them: the node is ready only once every worker is warm.
    workers_warm = app[STATE].get("workers_warm", lambda: True)()
    body = {
        "ready": unhealthy is None and workers_warm and not app[STATE].get("stopping", False),
        "engine_problem": unhealthy,
        # Up but not serving as configured: on the fallback, or (engine.fallback none) the
        # engine failed to start or stopped answering; systemd's watchdog is still fed.
        "degraded": bool(startup)
        or service.status.degraded
        or (service.status.ready and unhealthy is not None),
        "engine": _engine_json(service),
        "state": keeper.status(),  # degraded state never makes the node unready
        "connections": len(app[CONNECTIONS]),
        "node": app[NODE]["id"],
    }
    if startup:
        body["error"] = startup
    if not workers_warm:
        body["workers"] = "not all workers of this node are warm yet"
    return web.json_response(body, status=200 if body["ready"] else 503)


async def metrics_handler(request: web.Request) -> web.Response:
    app = request.app
    m = app[METRICS]
    m.connections.set(len(app[CONNECTIONS]))
    m.set_engine(app[SERVICE].status.active, app[SERVICE].status.degraded)
    # The Jetson collector reads sysfs files at every scrape: off the loop.
    body = await asyncio.to_thread(m.render) if m.jetson is not None else m.render()
    return web.Response(body=body, headers={"Content-Type": m.content_type})


async def api_sessions(request: web.Request) -> web.Response:
    _require_admin(request)
    sessions, complete = await request.app[KEEPER].list_sessions()
    return web.json_response({"sessions": sessions, "complete": complete})


async def api_nodes(request: web.Request) -> web.Response:
    _require_admin(request)
    nodes, complete = await request.app[KEEPER].list_nodes()
    return web.json_response({"nodes": nodes, "complete": complete})


async def api_engine_retry(request: web.Request) -> web.Response:
    _require_admin(request)
    service = request.app[SERVICE]
    ok = await service.retry_primary()
    return web.json_response({"ok": ok, "engine": _engine_json(service)}, status=200 if ok else 503)


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(request.app[STATE]["web_root"] / "index.html")  # 404 if absent


async def ws_handler(request: web.Request) -> web.StreamResponse:
    app = request.app
    cfg, service, keeper = app[CONFIG], app[SERVICE], app[KEEPER]
    try:  # a wrong version is the client's bug whatever the node's state: say so first
        protocol = choose_protocol(request.query.get("protocol"))
    except UnsupportedProtocol as e:
        raise web.HTTPBadRequest(
            text=json.dumps(refusal(e)) + "\n", content_type="application/json"
        ) from None
    if app[STATE].get("stopping"):
        raise web.HTTPServiceUnavailable(text="server is shutting down\n")
    if not service.status.ready:
        raise web.HTTPServiceUnavailable(
            text="engine is warming up; retry shortly\n", headers={"Retry-After": "1"}
        )
    if len(app[CONNECTIONS]) >= cfg.server.max_connections:
        raise web.HTTPServiceUnavailable(text="connection limit reached\n")

    mode_q = request.query.get("mode")
    if mode_q not in (None, "latest", "every"):
        raise web.HTTPBadRequest(text="mode must be 'latest' or 'every'\n")
    session: Session | None = None
    resumed = False
    token = request.query.get("resume")
    # Reported by the proxy in front (deploy/nginx); shown to admins, trusted for nothing.
    forwarded_for = request.headers.get("X-Forwarded-For", "")
    if token:
        # Claims the session in the state store, so it is this node's from here on.
        session = await keeper.find_resumable(token)
        resumed = session is not None
        if session is not None and session.id in app[CONNECTIONS]:
            old = app[CONNECTIONS].pop(session.id)
            await old.close(WSCloseCode.POLICY_VIOLATION, "session resumed elsewhere", "superseded")
    if session is None:
        session = new_session(
            app[NODE]["id"],
            cfg.session.default_mode,
            cfg.model.confidence,
            request.remote or "",
            request.headers.get("User-Agent", ""),
            forwarded_for,
        )
    else:
        session.client = request.remote or session.client
        session.forwarded_for = forwarded_for[:MAX_FORWARDED_FOR]
    if mode_q in ("latest", "every"):
        session.mode = mode_q  # type: ignore[assignment]

    ws = web.WebSocketResponse(
        max_msg_size=cfg.server.max_message_bytes,
        compress=False,  # JPEG does not deflate; results are small
        autoping=True,
        timeout=2.0,
        decode_text=False,
    )
    await ws.prepare(request)
    keeper.open_session(session)
    conn = Connection(ws, session, app[CONNECTION_CTX], protocol)
    app[CONNECTIONS][session.id] = conn
    spec = service.spec
    features: list[str] = app[FEATURES]
    try:
        await conn.send(
            reply.hello(
                session_id=session.id,
                resume_token=session.resume_token,
                resumed=resumed,
                model=spec.name,
                labels=list(spec.labels),
                engine=_engine_json(service),
                mode=session.mode,
                settings=session.settings_dict(),
                limits={
                    "max_message_bytes": cfg.server.max_message_bytes,
                    "max_pixels": cfg.server.max_pixels,
                    "input_size": spec.limits.target,
                    "stride": spec.limits.stride,
                    "max_side": spec.limits.max_side,
                    "max_batch": service.engine.max_batch if service.engine else 1,
                    "formats": ["jpeg", "png"],
                    "binary_frames": True,
                },
                counters=session.counters(),
                node_id=app[NODE]["id"],
                protocol=protocol.number,
                features=features,
            )
        )
        await conn.serve()
    except Exception as e:
        if not isinstance(e, ConnectionError | asyncio.CancelledError):
            log.exception("connection %s failed", session.id)
    finally:
        if app[CONNECTIONS].get(session.id) is conn:
            del app[CONNECTIONS][session.id]
        if conn.closed_by_server != "superseded":
            ended = conn.client_close_code == WSCloseCode.OK and conn.closed_by_server is None
            keeper.close_session(session, ended=ended)
        if not ws.closed:
            await ws.close()
    return ws


# -- lifecycle --------------------------------------------------------------------------


async def _start_engine(app: web.Application) -> None:
    try:
        await app[SERVICE].start()
    except EdgeVisionError as e:
        app[STATE]["startup_error"] = str(e)
        log.error("engine failed to start: %s", e)
        raise
    app[METRICS].set_engine(app[SERVICE].status.active, app[SERVICE].status.degraded)


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    keeper = app[KEEPER]
    await keeper.start()
    app[STARTUP] = asyncio.create_task(_start_engine(app), name="engine-start")
    yield
    await cancel_and_wait(app[STARTUP])
    await app[SERVICE].close()
    await app[PIPELINE].close()
    await keeper.shutdown()


async def _on_shutdown(app: web.Application) -> None:
    """Stop accepting; answer frames in flight; close sockets with 1001 and a resume hint."""
    app[STATE]["stopping"] = True
    conns = list(app[CONNECTIONS].values())
    grace = app[CONFIG].server.shutdown_grace_s
    try:
        await with_timeout(asyncio.gather(*(c.wait_idle() for c in conns)), grace)
    except TimeoutError:
        log.warning("frames still in flight after %.1f s; closing anyway", grace)
    # Sessions are written as released before the sockets close, so a client that
    # resumes on another node at once finds its latest settings and counters there.
    await app[KEEPER].hand_over()
    for c in conns:
        try:
            await c.send(reply.closing(c.session.resume_token))
        except ConnectionDone:  # the client may already be gone
            pass
        await c.close(
            WSCloseCode.GOING_AWAY, "server shutting down; resume with your token", "shutdown"
        )


def create_app(config: Config, spec: ModelSpec | None = None) -> web.Application:
    """Build the application; the engine starts when the app starts."""
    logging.getLogger("edge_vision").setLevel(config.logging.level.upper())
    spec = spec or load_model_spec(config.model, config.engine.max_batch)
    metrics = Metrics()
    service = InferenceService(spec, config, metrics=metrics)
    pipeline = FramePipeline(config, service)
    node_id = _node_id(config)
    app = web.Application(client_max_size=1024**2)
    app[CONFIG] = config
    app[METRICS] = metrics
    app[SERVICE] = service
    app[PIPELINE] = pipeline
    app[CONNECTIONS] = {}
    app[FEATURES] = list(BASE_FEATURES)
    app[STATE] = {"web_root": config.server.web_root or REPO_WEB}
    started = time.time()
    app[NODE] = {"id": node_id, "started": started}

    def node_record() -> dict[str, str]:
        st = service.status
        return {
            "id": node_id,
            "address": config.state.advertise_url or f"{socket.gethostname()}:{config.server.port}",
            "model": spec.name,
            "engine": st.active or st.configured,
            "degraded": "1" if st.degraded else "0",
            "started": repr(started),
            "heartbeat": repr(time.time()),
            "connections": str(len(app[CONNECTIONS])),
            "in_flight": str(service.in_flight),
            "max_connections": str(config.server.max_connections),
            "protocol": str(PROTOCOL_VERSION),
        }

    closing: set[asyncio.Task[None]] = set()

    def superseded(session_id: str) -> None:
        """A newer connection resumed this session on another node: close ours (1008)."""
        conn = app[CONNECTIONS].pop(session_id, None)
        if conn is not None:
            task = asyncio.create_task(
                conn.close(WSCloseCode.POLICY_VIOLATION, "session resumed elsewhere", "superseded")
            )
            closing.add(task)  # keep a reference until it is done
            task.add_done_callback(closing.discard)

    keeper = StateKeeper(
        create_store(config.state),
        config.state,
        node_id,
        node_record,
        metrics,
        on_superseded=superseded,
    )
    app[KEEPER] = keeper
    app[CONNECTION_CTX] = ConnectionContext(config, pipeline, metrics, keeper, spec.label)
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_on_shutdown)
    app.router.add_get("/ws", ws_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/api/sessions", api_sessions)
    app.router.add_get("/api/nodes", api_nodes)
    app.router.add_post("/api/engine/retry", api_engine_retry)
    app.router.add_get("/", index)
    web_root = app[STATE]["web_root"]
    if Path(web_root).is_dir():
        app.router.add_static("/static/", web_root, follow_symlinks=False)
    return app


def run_server(config: Config) -> None:
    """Serve until SIGINT/SIGTERM, telling systemd READY/WATCHDOG/STATUS/STOPPING.

    With ``server.workers`` > 1, that many processes share the port (SO_REUSEPORT), each
    with its own event loop and engine, under a parent that speaks for the node: the
    contract and the supervisor live in edge_vision/workers.py."""
    from .workers import run_node

    run_node(config)
