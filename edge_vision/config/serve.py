"""The shell's sections: ``server``, ``auth``, ``limits``, ``logging``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from .base import ENV_PREFIX, ENV_TOKEN_SECRET, _Section


class ServerConfig(_Section):
    host: str | None = Field(
        None,
        description="Address to listen on. Unset: 127.0.0.1 (this machine only) while "
        "auth.enabled is off, so the demo is not on the network; 0.0.0.0 (every interface) "
        "with auth on. Set 0.0.0.0 to let other machines connect (turn auth on first: "
        "docs/security.md).",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names this node answers /ws, /metrics and /api/* to while auth is "
        "off, besides IP addresses, localhost and this machine's own name: a page whose "
        "name resolves to the node (DNS rebinding) is refused. '*' allows any. With auth "
        "on the credential decides and this is not checked.",
    )
    port: int = Field(8080, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    max_message_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="Largest WebSocket message accepted (announced in hello; the Python "
        "client refuses a larger frame before sending it, with MessageTooBig); a larger one "
        "closes the socket with 1009. Raise it for large PNG frames.",
    )
    max_pixels: int = Field(
        40_000_000,
        ge=1,
        description="Largest image (width x height) accepted, checked from the header before "
        "decoding; larger is answered with image_too_large, whose message names this "
        "setting. The one pixel limit to state: server.max_decoded_bytes follows it unless "
        "set.",
    )
    max_decoded_bytes: int = Field(
        3 * 40_000_000,
        ge=1024,
        description="Most bytes one frame may decode to (BGR, 3 bytes a pixel, after any DCT "
        "downscale), checked from the header before decoding; more is answered with "
        "decoded_too_large, whose message names this setting and the largest PNG it takes. "
        "Unless set, derived: server.max_pixels x 3, so every image the pixel limit admits "
        "decodes, but no more than half of one worker's share of the memory budget "
        "(server.memory_budget_bytes / server.workers) rounded down to a power of two: a "
        "PNG's decode holds the decoder's own pixels and the pool's power-of-two buffer at "
        "once, so a frame that passes is not refused later for want of memory on an idle "
        "worker. Set it lower to refuse large PNGs (which are "
        "never scaled down while decoding: a 116 KB PNG of 6,320 x 6,320 zeros decodes to "
        "120 MB) while JPEGs up to max_pixels still decode scaled down.",
    )
    memory_budget_bytes: int = Field(
        512 * 1024 * 1024,
        ge=16 * 1024 * 1024,
        description="Bytes held by frames (encoded, decoding, in flight) and the decode "
        "buffer pool, across all connections of the node; divided evenly between "
        "server.workers. A frame without room waits (every mode, up to memory_wait_s) or is "
        "answered with over_memory_budget. 512 MiB holds 64 maximal 8 MiB frames, or "
        "thousands of 720p ones, and fits an 8 GB Jetson beside the model.",
    )
    memory_wait_s: float = Field(
        1.0,
        ge=0,
        description="How long an 'every' frame without room in the memory budget waits "
        "(its connection's reading paused: TCP back-pressure) before it is answered with "
        "over_memory_budget. 'latest' frames never wait: a stale frame is worth less.",
    )
    max_connections: int = Field(256, ge=1, description="Open WebSockets above this get 503.")
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Processes serving the port, each with its own event loop and engine "
        "(server.worker_balance says how connections reach them). More than one lifts one "
        "Python interpreter's limit on frames per second (a fast GPU can serve more than "
        "one process can decode and post-process). Sessions resume across workers only "
        "with a shared state store (state.redis_url).",
    )
    worker_balance: Literal["least-clients", "reuse-port"] = Field(
        "least-clients",
        description="With server.workers > 1, how connections are spread over the workers: "
        "least-clients, the node's main process accepts each and hands it to the worker "
        "with the fewest clients (among those whose engine is warm); reuse-port, every "
        "worker listens (SO_REUSEPORT) and the kernel picks by a hash of the client's "
        "address, which put 2 cameras on one worker and 8 on another at 64 cameras on 12 "
        "workers (edge_vision/serve/balance.py, docs/benchmarks.md).",
    )
    gpu_process: Literal["auto", "on", "off"] = Field(
        "off",
        description="One process per GPU owns decode, the engine and post-processing for "
        "every worker of the node; the workers hand it the frames still compressed through "
        "shared memory and get the detections back, so it batches across every camera "
        "(edge_vision/gpu_process/, docs/gpu.md). off, the default until its GPU proof "
        "lands: each worker runs its own engine, as before. on: always; on a machine "
        "without a GPU its CPU stand-in (ONNX Runtime and host decode in the same process "
        "shell). auto: on where engine.kind runs on a GPU. Touch it on a GPU host whose "
        "many cameras the workers' own GPU contexts cannot carry; each worker then needs "
        "4 x server.max_message_bytes of /dev/shm (containers: shm_size).",
    )
    ping_interval_s: float = Field(
        20.0, gt=0, description="WebSocket ping period (RFC 6455 5.5.2)."
    )
    idle_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Close a connection after this long without any message from it, with "
        "4003 (protocol 1: 1001).",
    )
    send_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A reply that cannot be written for this long means the client stopped "
        "reading: the connection is closed with 4002 (protocol 1: 1008).",
    )
    shutdown_grace_s: float = Field(
        5.0, ge=0, description="On SIGTERM, time given to frames in flight before sockets close."
    )
    admin_token: str | None = Field(
        None, description="Bearer token required by /api/*; none means the admin API is open."
    )
    web_root: Path | None = Field(
        None,
        description="Folder served at / instead of the overlay page that ships in the "
        "package (edge_vision/web/): set it to serve a page of your own.",
    )
    close_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Once the server closed a connection, how long the client has to take "
        "what was still being sent to it (a close frame, replies it never read) before the "
        "connection is reset and those bytes dropped, so a client that never reads costs "
        "nothing after send_timeout_s plus this. A client that reads gets a clean close.",
    )
    close_linger_s: float = Field(
        2.0,
        ge=0,
        description="After closing with 1009 (message too large), keep reading and "
        "discarding for at most this long, so a client still writing its message receives "
        "the close frame instead of a connection reset; 0 closes at once.",
    )
    mmap_threshold_bytes: int | None = Field(
        256 * 1024,
        ge=0,
        le=32 * 1024 * 1024,
        description="Each worker process serves every allocation of this size or more "
        "with its own mmap (glibc mallopt M_MMAP_THRESHOLD, fixed), so a large message or "
        "frame goes back to the system when it is freed instead of staying in the heap. "
        "glibc starts at 128 KiB and raises it up to 32 MiB as big blocks are freed. With "
        "64 connections of 8 MiB frames the peak was about 200 MiB lower at 256 KiB "
        "(docs/benchmarks.md, 'Memory budget'); none keeps glibc's rising threshold.",
    )
    opencv_threads: int | None = Field(
        None,
        ge=1,
        le=256,
        description="Threads OpenCV may use inside one call (cv2.setNumThreads), in each "
        "worker process. None: 1 while a CUDA engine serves (frames letterboxed on the GPU "
        "or the host), else OpenCV's one per core. Under a CUDA engine, OpenCV's pool "
        "under each worker's frame threads costs several times one thread's CPU for the "
        "same DB post-processing, and with the host letterbox one thread costs less CPU a "
        "frame and answers more frames; on the CPU path (ONNX Runtime) 1 answers fewer "
        "frames than the default "
        "(docs/benchmarks.md, 'a fair host path, and where the GIL goes' and 'OpenCV's own "
        "threads on the CPU path').",
    )
    event_loop: Literal["asyncio", "uvloop"] = Field(
        "asyncio",
        description="Each serving process's event loop: asyncio (Python's own) or uvloop "
        "(libuv, pip install uvloop). uvloop took 10 % less server CPU a WebSocket message "
        "on the 2-core machine, under 1 % of a frame's cost on the GPU path "
        "(python -m benchmarks.loop, docs/benchmarks.md).",
    )

    @field_validator("gpu_process", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: object) -> object:
        """YAML reads a bare on/off as true/false: both mean the words."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _decoded_bytes_follow_pixels(self) -> ServerConfig:
        """server.max_decoded_bytes, unless set: what the pixel limit admits, within what
        one worker's memory budget can decode (its description says why). Runs again on
        every assignment, so a worker count derived later (engine.kind auto) is followed."""
        if "max_decoded_bytes" not in self.model_fields_set:
            share = self.memory_budget_bytes // self.workers // 2
            pool_buffer = 1 << (share.bit_length() - 1)  # the pool's power-of-two classes
            self.__dict__["max_decoded_bytes"] = max(1024, min(3 * self.max_pixels, pool_buffer))
        return self

    test_echo_route: bool = Field(
        False,
        description="Tests only: serve a WebSocket echo route at /test/echo with /ws's "
        "WebSocket settings (for Autobahn|Testsuite). Never enable in production.",
    )


class ApiKeyConfig(_Section):
    name: str = Field(
        ..., pattern=r"^[A-Za-z0-9._:@-]{1,128}$", description="Who holds the key (the subject)."
    )
    sha256: str = Field(
        ...,
        pattern=r"^[0-9a-f]{64}$",
        description="Hex SHA-256 of the key (edge-vision token --new-api-key prints both); "
        "the key itself is never in the config.",
    )
    scopes: list[Literal["stream", "admin"]] = Field(
        default_factory=lambda: list[Literal["stream", "admin"]](["stream"]),
        description="stream: /ws; admin: /metrics, /api/*.",
    )


class AuthConfig(_Section):
    """Who may connect (docs/security.md). Off for the local demo; on in every shipped
    deployment config."""

    enabled: bool = Field(
        False,
        description="Require a credential (API key or signed token) on /ws, and the admin "
        "scope on /metrics and /api/*. Off: anyone who reaches the port may connect.",
    )
    api_keys: list[ApiKeyConfig] = Field(
        default_factory=list, description="Static API keys, stored as their SHA-256."
    )
    token_secret_file: Path | None = Field(
        None,
        description="File holding the HMAC secret that signs tokens (at least 32 bytes); "
        "read at start, never logged. Unset: the variable named by token_secret_env.",
    )
    token_secret_env: str = Field(
        ENV_TOKEN_SECRET,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="Environment variable holding the token secret when no file is named "
        "(not another EDGE_VISION_ name: those are config keys).",
    )

    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins (scheme://host[:port]) allowed to open /ws besides the "
        "page's own; '*' allows any. Checked whenever a handshake carries Origin, auth on "
        "or off; clients that send no Origin are judged by their credential alone.",
    )
    allow_query_token: bool = Field(
        True,
        description="Accept ?access_token= as a last resort (redacted from logs); prefer "
        "Authorization: Bearer or the subprotocol entry.",
    )

    @model_validator(mode="after")
    def _secret_env_is_not_config(self) -> AuthConfig:
        env = self.token_secret_env
        if env.startswith(ENV_PREFIX) and env != ENV_TOKEN_SECRET:
            raise ValueError(f"auth.token_secret_env {env!r} would be read as a config key")
        return self


class LimitsConfig(_Section):
    """Fair shares of connections (docs/security.md, "Limits"); server.max_connections is
    the total."""

    max_connections_per_address: int = Field(
        64, ge=1, description="Open WebSockets from one client address above this get 503."
    )
    max_connections_per_token: int = Field(
        128,
        ge=1,
        description="Open WebSockets of one API key, or of all tokens of one subject, above "
        "this get 503.",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Peers (addresses or CIDRs, e.g. 127.0.0.1 or 10.0.0.0/8) whose "
        "X-Forwarded-For names the client; from any other peer the header is ignored.",
    )
    slow_client_strikes: int = Field(
        3,
        ge=1,
        description="Connections from one client address closed for not reading their "
        "results (4002, or reset after server.close_timeout_s) within "
        "slow_client_penalty_s, after which that address is refused new WebSockets (503) "
        "for slow_client_penalty_s.",
    )
    slow_client_penalty_s: float = Field(
        60.0,
        ge=0,
        description="How long an address that reached slow_client_strikes is refused, and "
        "the window its strikes are counted in; 0 turns the penalty off (benches and "
        "tests whose clients all share 127.0.0.1 may).",
    )
    handshake_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A TCP connection that has not sent a complete HTTP request this long "
        "after it opened (or after its last one) is closed; also bounds the work before "
        "the WebSocket upgrade (credential check, resume claim).",
    )

    @model_validator(mode="after")
    def _proxies_parse(self) -> LimitsConfig:
        import ipaddress

        for entry in self.trusted_proxies:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(
                    f"limits.trusted_proxies: {entry!r} is not an address or CIDR"
                ) from None
        return self


class LoggingConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
