"""The aiohttp application: routes, typed app state and lifecycle. A thin shell.

Routes: ``GET /ws`` (the protocol, docs/protocol.md), ``GET /healthz`` (process alive),
``GET /readyz`` (engine loaded and warmed up; 503 before), ``GET /metrics`` (Prometheus),
``GET /api/sessions`` and ``GET /api/nodes`` (admin, bearer token when configured),
``POST /api/engine/retry`` (try the configured engine again after a degrade) and the
overlay page at ``/`` and the dashboard at ``/dashboard`` (web/dashboard.html).

Start-up: the HTTP port opens at once (so /healthz answers), the engine loads and warms
up in the background, and /ws and /readyz turn ready after warm-up. Shutdown (SIGTERM):
stop accepting, let frames in flight finish for ``server.shutdown_grace_s``, close every
socket with 1001 and a resume hint, remove this node's keys from the state store.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import WSCloseCode, web

from .. import __version__
from ..common.aio import cancel_and_wait, with_timeout
from ..common.close_codes import CloseCode
from ..common.metrics import Metrics
from ..common.settings import is_mode
from ..config import Config, engine_kinds, session_input_sizes
from ..engines.choice import engine_choice_of, resolve_engine
from ..errors import ConfigError, EdgeVisionError, UnsupportedProtocol
from ..events.hub import EventHub
from ..events.sinks import build_sinks
from ..frames.infer import InferenceService
from ..model.spec import ModelSpec, load_model_spec
from ..session import reply
from ..session.receive import PROTOCOL_VERSION
from ..session.record import MAX_FORWARDED_FOR, Session, new_secret, new_session
from ..session.versions import BASE_FEATURES, SUBPROTOCOL, choose_protocol, refusal
from ..state import StateKeeper, create_store
from . import auth
from .app_keys import (
    ADDRESS,
    AUTH,
    CONFIG,
    CONNECTION_CTX,
    CONNECTIONS,
    FEATURES,
    HOST_NAMES,
    KEEPER,
    LIMITS,
    METRICS,
    PENALTIES,
    PIPELINE,
    SERVICE,
    STARTUP,
    STATE,
    TRUSTED_PROXIES,
    NodeState,
)
from .connection import Connection, ConnectionContext, ConnectionDone
from .exposure import check_exposure, node_names
from .gpu_node import GpuNode, frame_path
from .limits import (
    ConnectionLimits,
    LimitExceeded,
    LimitsPolicy,
    PenaltyBox,
    client_address,
    parse_networks,
)
from .offences import Offences
from .websocket import ECHO_PATH, echo_handler, websocket_response

log = logging.getLogger(__name__)

# Subprotocols a WebSocket of ours offers to echo (credential entries never are: auth.py).
WS_PROTOCOLS = (SUBPROTOCOL,)
#: Per-request: who ws_entry admitted, and a resume token sent as a subprotocol entry.
PRINCIPAL = web.RequestKey("principal", auth.Principal)
RESUME: web.RequestKey[str | None] = web.RequestKey("resume")

#: The overlay page ships inside the package (package-data in pyproject.toml), so an
#: installed wheel serves it from any directory.
PACKAGE_WEB = Path(__file__).resolve().parents[1] / "web"


def _node_id(config: Config) -> str:
    return config.state.node_id or f"{socket.gethostname()}-{os.getpid()}"


def _refused(err: auth.AuthError) -> web.HTTPException:
    """401 (with a Bearer challenge, RFC 6750 section 3) or 403, body: the short reason."""
    if err.status == 403:
        return web.HTTPForbidden(text=f"forbidden: {err.reason}\n")
    return web.HTTPUnauthorized(
        text=f"unauthorized: {err.reason}\n",
        headers={"WWW-Authenticate": 'Bearer realm="edge_vision"'},
    )


def _authenticate(request: web.Request, scope: auth.Scope) -> auth.Principal:
    """Who is asking, with ``scope`` required; raises 401/403. With auth off everyone is
    :data:`~edge_vision.serve.auth.ANONYMOUS` (all scopes), except that a configured
    ``server.admin_token`` still guards the admin scope. First, what a page on another
    site may send is refused: a foreign Origin, two of them, DNS rebinding (exposure.py)."""
    cfg = request.app[CONFIG]
    check_exposure(request.headers, request.host, cfg, request.app[HOST_NAMES])
    shown = auth.presented(request.headers, request.query if cfg.auth.allow_query_token else {})
    admin_token = cfg.server.admin_token
    if (
        admin_token
        and shown.credential is not None
        and hmac.compare_digest(shown.credential.encode(), admin_token.encode())
    ):
        return auth.Principal("admin_token", frozenset(auth.SCOPES), "api_key")
    if not cfg.auth.enabled:
        if scope == "admin" and admin_token:
            raise _refused(auth.AuthError(401, "admin token required (Authorization: Bearer)"))
        return auth.ANONYMOUS
    try:
        principal = request.app[AUTH].authenticate(shown.credential)
        principal.require(scope)
    except auth.AuthError as e:
        raise _refused(e) from None
    return principal


def _require_admin(request: web.Request) -> None:
    _authenticate(request, "admin")


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
    startup = app[STATE].startup_error
    unhealthy = await service.health()
    # With server.workers > 1 any worker may answer this probe, and the kernel hands new
    # sockets to any of them: the node is ready only once every worker is warm.
    workers_warm = app[STATE].workers_warm()
    body = {
        "ready": unhealthy is None and workers_warm and not app[STATE].stopping,
        "engine_problem": unhealthy,
        # Up but not serving as configured: on the fallback, or (engine.fallback none) the
        # engine failed to start or stopped answering; systemd's watchdog is still fed.
        "degraded": bool(startup)
        or service.status.degraded
        or (service.status.ready and unhealthy is not None),
        "engine": _engine_json(service),
        # Why this engine (engine.kind auto: the machine's reason and what it derived).
        "engine_choice": engine_choice_of(app[CONFIG]),
        "state": keeper.status(),  # degraded state never makes the node unready
        "connections": len(app[CONNECTIONS]),
        "node": app[STATE].node_id,
        "version": __version__,  # the package's (CHANGELOG.md); the protocol's is in hello
    }
    if app[LIMITS].full:  # a balancer should send new cameras elsewhere
        body["ready"] = False
        body["full"] = True
        body["reason"] = "full: no connection slot left (server.max_connections)"
    if startup:
        body["error"] = startup
    if not workers_warm:
        body["workers"] = "not all workers of this node are warm yet"
    return web.json_response(body, status=200 if body["ready"] else 503)


async def metrics_handler(request: web.Request) -> web.Response:
    _require_admin(request)
    app = request.app
    m = app[METRICS]
    m.connections.set(len(app[CONNECTIONS]))
    service = app[SERVICE]
    m.set_engine(service.status.active, service.status.degraded, service.max_batch)
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


async def index(request: web.Request) -> web.StreamResponse:  # / and /dashboard (web/)
    page = "dashboard.html" if request.path == "/dashboard" else "index.html"
    return web.FileResponse(request.app[STATE].web_root / page)  # 404 if absent


async def ws_entry(request: web.Request) -> web.StreamResponse:
    """``GET /ws`` admission, before anything else: origin, credential, fair share.

    Each refusal is an HTTP status before the upgrade with a one-line body saying why, so
    the JavaScript client (which asks again with a plain GET, see edge_vision/web/client/)
    and other clients can tell "not authorised" from "full" (docs/protocol.md, "Refusals")."""
    app = request.app
    cfg = app[CONFIG]
    # Cross-site WebSocket hijacking (RFC 6455 section 10.2) and DNS rebinding: judged
    # before credentials, so a foreign page learns nothing about them (_authenticate).
    principal = _authenticate(request, "stream")
    request[PRINCIPAL] = principal
    request[RESUME] = auth.presented(request.headers, {}).resume_token
    address = client_address(
        request.remote or "", request.headers.get("X-Forwarded-For", ""), app[TRUSTED_PROXIES]
    )
    request[ADDRESS] = address
    penalty = app[PENALTIES].refused_for(address)
    if penalty > 0:  # its connections kept not reading their results (limits.PenaltyBox)
        app[METRICS].connections_refused.labels("slow_client").inc()
        raise web.HTTPServiceUnavailable(
            text=app[PENALTIES].message(penalty) + "\n",
            headers={"Retry-After": str(math.ceil(penalty))},
        )
    slot = app[LIMITS].acquire(address, principal.limit_key if cfg.auth.enabled else None)
    if isinstance(slot, LimitExceeded):
        app[METRICS].connections_refused.labels(slot.limit).inc()
        raise web.HTTPServiceUnavailable(text=slot.message + "\n", headers={"Retry-After": "5"})
    try:
        return await ws_handler(request)
    finally:
        slot.release()


def _close_when_expired(
    conn: Connection, principal: auth.Principal | None
) -> asyncio.TimerHandle | None:
    """Close with 4001 when the credential this connection came in with expires."""
    if principal is None or principal.expires_at is None:
        return None

    def expire() -> None:
        task = asyncio.create_task(
            conn.close(CloseCode.TOKEN_EXPIRED, "token expired", "token_expired")
        )
        _BACKGROUND.add(task)  # keep a reference until it is done
        task.add_done_callback(_BACKGROUND.discard)

    delay = max(0.0, principal.expires_at - time.time())
    return asyncio.get_running_loop().call_later(delay, expire)


_BACKGROUND: set[asyncio.Task[None]] = set()


async def ws_handler(request: web.Request) -> web.StreamResponse:
    app = request.app
    cfg, service, keeper = app[CONFIG], app[SERVICE], app[KEEPER]
    try:  # a wrong version is the client's bug whatever the node's state: say so first
        protocol = choose_protocol(request.query.get("protocol"))
    except UnsupportedProtocol as e:
        raise web.HTTPBadRequest(
            text=json.dumps(refusal(e)) + "\n", content_type="application/json"
        ) from None
    if app[STATE].stopping:
        raise web.HTTPServiceUnavailable(text="server is shutting down\n")
    if not service.status.ready:
        raise web.HTTPServiceUnavailable(
            text="engine is warming up; retry shortly\n", headers={"Retry-After": "1"}
        )

    mode_q = request.query.get("mode")
    if mode_q is not None and not is_mode(mode_q):
        raise web.HTTPBadRequest(text="mode must be 'latest' or 'every'\n")
    # The same settings as the test-only echo route Autobahn checks (websocket.py).
    offences = Offences(request)
    ws = websocket_response(cfg.server, WS_PROTOCOLS, on_abort=offences.reset)
    if not ws.can_prepare(request).ok:
        # A plain GET that passed every check: a browser's address bar, curl, or the page
        # asking why its socket failed (it reads the 426 as "nothing refuses you now").
        raise web.HTTPUpgradeRequired(
            text="/ws needs a WebSocket upgrade: connect with a WebSocket client "
            "(edge_vision.client, or the overlay page at /), not a plain HTTP request. "
            "Nothing refuses you now: the upgrade would be accepted\n"
        )
    session: Session | None = None
    resumed = False
    # Since protocol 2 a subprotocol entry (out of URLs and access logs); ?resume= is
    # protocol 1's, still served, deprecated.
    token = request.get(RESUME) or request.query.get("resume")
    # Reported by the proxy in front (deploy/nginx); shown to admins, trusted for nothing.
    forwarded_for = request.headers.get("X-Forwarded-For", "")
    if token:
        # Claims the session in the state store, so it is this node's from here on.
        session = await keeper.find_resumable(token)
        resumed = session is not None
        if session is not None and session.id in app[CONNECTIONS]:
            old = app[CONNECTIONS].pop(session.id)
            await old.close(CloseCode.SUPERSEDED, "session resumed elsewhere", "superseded")
    if session is None:
        session = new_session(
            app[STATE].node_id,
            cfg.session.default_mode,
            cfg.model.confidence,
            request.remote or "",
            request.headers.get("User-Agent", ""),
            forwarded_for,
        )
    else:
        session.client = request.remote or session.client
        session.forwarded_for = forwarded_for[:MAX_FORWARDED_FOR]
    if is_mode(mode_q):
        session.mode = mode_q

    try:
        await ws.prepare(request)
    except ConnectionError:  # the client reset the connection during the upgrade
        log.info("client %s went away during the WebSocket handshake", request.remote)
        return ws
    keeper.open_session(session)
    conn = Connection(ws, session, app[CONNECTION_CTX], protocol)
    app[CONNECTIONS][session.id] = conn
    expiry = _close_when_expired(conn, request.get(PRINCIPAL))
    spec = service.spec
    features: list[str] = app[FEATURES]
    # Since protocol 3 a resume hands out a new token; the old one stops working once
    # this hello was written (a hello lost before that leaves the old one valid).
    fresh = new_secret() if resumed and protocol.rotating_resume_tokens else None
    try:
        await conn.send(
            reply.hello(
                session_id=session.id,
                resume_token=f"{session.id}.{fresh}" if fresh else session.resume_token,
                resumed=resumed,
                model=spec.name,
                labels=list(spec.labels),
                engine=_engine_json(service),
                mode=session.mode,
                settings={  # since protocol 3 with the session's own zones, lines, rules
                    **session.settings_dict(),
                    **(session.events_settings() if protocol.events else {}),
                },
                limits={
                    "max_message_bytes": cfg.server.max_message_bytes,
                    "max_pixels": cfg.server.max_pixels,
                    "max_decoded_bytes": cfg.server.max_decoded_bytes,  # since protocol 2
                    "input_size": spec.limits.target,
                    "input_sizes": session_input_sizes(cfg),  # since protocol 2
                    "stride": spec.limits.stride,
                    "max_side": spec.limits.max_side,
                    "max_batch": service.max_batch,
                    "formats": ["jpeg", "png"],
                    "binary_frames": True,
                    # since protocol 2: the read budget (docs/protocol.md, "Read budget")
                    "max_messages_per_s": cfg.session.max_messages_per_s,
                    "message_burst": cfg.session.message_burst,
                },
                counters=session.counters(),
                node_id=app[STATE].node_id,
                protocol=protocol.number,
                features=features,
                events=cfg.events.announced() if protocol.events else None,  # since protocol 3
            )
        )
        if fresh:
            session.use_secret(fresh)
            await keeper.write_now(session)  # the store's hash too, before reading on
        await conn.serve()
    except Exception as e:
        # A client gone while we wrote (ConnectionDone: its hello, say) is no failure.
        if not isinstance(e, ConnectionError | ConnectionDone | asyncio.CancelledError):
            log.exception("connection %s failed", session.id)
    finally:
        if expiry is not None:
            expiry.cancel()
        if app[CONNECTIONS].get(session.id) is conn:
            del app[CONNECTIONS][session.id]
        if conn.closed_by_server != "superseded":
            ended = conn.client_close_code == WSCloseCode.OK and conn.closed_by_server is None
            keeper.close_session(session, ended=ended)
        conn.end_events()
        if not ws.closed:
            await ws.close()
        if conn.closed_by_server == "slow_client":
            offences.strike()
        await ws.settle()  # the client took the close, or was reset (server.close_timeout_s)
    return ws


# -- lifecycle --------------------------------------------------------------------------


async def _start_engine(app: web.Application) -> None:
    try:
        await app[SERVICE].start()
    except EdgeVisionError as e:
        app[STATE].startup_error = str(e)
        log.error("engine failed to start: %s", e)
        raise
    service = app[SERVICE]
    app[METRICS].set_engine(service.status.active, service.status.degraded, service.max_batch)
    # A serving process's own step once its engine is warm (workers.py freezes the start-up
    # heap): here, before the loop runs anything else, so no session is part of it.
    on_started = app[STATE].on_engine_started
    if on_started is not None:
        on_started()


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    keeper = app[KEEPER]
    await keeper.start()
    events = app[CONNECTION_CTX].events
    await events.start()
    app[STARTUP] = asyncio.create_task(_start_engine(app), name="engine-start")
    yield
    await cancel_and_wait(app[STARTUP])
    await app[SERVICE].close()
    await app[PIPELINE].close()
    # What the sessions raised as they closed gets a moment to reach the sinks; the rest
    # stays in the outbox file (events.outbox_dir) for the next start.
    await events.close(drain_s=app[CONFIG].server.shutdown_grace_s)
    await keeper.shutdown()


async def _on_shutdown(app: web.Application) -> None:
    """Stop accepting; answer frames in flight; close sockets with 1001 and a resume hint."""
    app[STATE].stopping = True
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


def _authenticator(config: Config) -> auth.Authenticator:
    """The configured keys and token secret; with auth on and no way to pass, stop."""
    a = config.auth
    keys = [auth.ApiKey(k.name, bytes.fromhex(k.sha256), frozenset(k.scopes)) for k in a.api_keys]
    secret = auth.read_token_secret(a.token_secret_file, a.token_secret_env, os.environ)
    if a.enabled and not keys and secret is None and not config.server.admin_token:
        raise ConfigError(
            "auth.enabled is true but no credential could ever pass: configure auth.api_keys, "
            f"auth.token_secret_file or the {a.token_secret_env} environment variable"
        )
    return auth.Authenticator(keys, secret)


def create_app(
    config: Config, spec: ModelSpec | None = None, *, gpu_process: GpuNode | None = None
) -> web.Application:
    """Build the application; the engine starts when the app starts (gpu_node.py)."""
    config = resolve_engine(config)  # no-op unless engine.kind is auto (run_node resolves)
    logging.getLogger("edge_vision").setLevel(config.logging.level.upper())
    auth.install_log_redaction()  # whoever logs, no line carries a credential
    spec = spec or load_model_spec(config.model)
    metrics = Metrics(engine_kinds())
    service, pipeline = frame_path(config, spec, metrics, gpu_process)
    metrics.watch_memory(pipeline.budget, pipeline.pool)
    node_id = _node_id(config)
    app = web.Application(
        client_max_size=1024**2,
        # aiohttp closes a connection that has not sent a whole request this long after it
        # opened (or after its previous one): a slow or silent handshake holds no socket.
        handler_args={"keepalive_timeout": config.limits.handshake_timeout_s},
    )
    app[CONFIG] = config
    app[METRICS] = metrics
    app[SERVICE] = service
    app[PIPELINE] = pipeline
    app[CONNECTIONS] = {}
    app[FEATURES] = list(BASE_FEATURES)
    # Since protocol 2: results carry track ids; a session may pick its input size.
    app[FEATURES] += ["track", "input_size"]
    if config.read.enabled:  # since protocol 2: settings.read (read.py)
        app[FEATURES].append("read")
    app[FEATURES].append("events")  # since protocol 3: zones, rules, event messages
    started = time.time()
    app[STATE] = NodeState(node_id, started, Path(config.server.web_root or PACKAGE_WEB))

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
        """A newer connection resumed this session on another node: close ours (4000)."""
        conn = app[CONNECTIONS].pop(session_id, None)
        if conn is not None:
            task = asyncio.create_task(
                conn.close(CloseCode.SUPERSEDED, "session resumed elsewhere", "superseded")
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
    # Events (docs/events.md): every session's, to the sinks events.sinks names.
    sinks = build_sinks(config.events, config.state, client_id=f"edge-vision-{node_id}")
    hub = EventHub(config.events, sinks, metrics)
    app[CONNECTION_CTX] = ConnectionContext(
        config, pipeline, metrics, keeper, spec.label, hub, node_id
    )
    app[AUTH] = _authenticator(config)
    # Held in clear, so redacted from every log line by their value (auth.redact_values).
    auth.redact_values([app[AUTH].token_secret, config.server.admin_token])
    if config.auth.enabled:
        app[FEATURES].append("auth")
    # With server.workers = N each worker holds its share (docs/security.md).
    app[LIMITS] = ConnectionLimits(
        LimitsPolicy(
            config.server.max_connections,
            config.limits.max_connections_per_address,
            config.limits.max_connections_per_token,
        ).for_workers(config.server.workers)
    )
    app[TRUSTED_PROXIES] = parse_networks(config.limits.trusted_proxies)
    app[HOST_NAMES] = node_names(config)
    app[PENALTIES] = PenaltyBox(
        config.limits.slow_client_strikes, config.limits.slow_client_penalty_s
    )
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_on_shutdown)
    app.router.add_get("/ws", ws_entry)
    if config.server.test_echo_route:  # tests only (Autobahn|Testsuite), never production
        app.router.add_get(ECHO_PATH, echo_handler(config.server, WS_PROTOCOLS))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/api/sessions", api_sessions)
    app.router.add_get("/api/nodes", api_nodes)
    app.router.add_post("/api/engine/retry", api_engine_retry)
    app.router.add_get("/", index)
    app.router.add_get("/dashboard", index)
    web_root = app[STATE].web_root
    if Path(web_root).is_dir():
        app.router.add_static("/static/", web_root, follow_symlinks=False)
    return app
