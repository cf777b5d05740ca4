"""A real Triton Inference Server as a child process, for the Triton tests.

``tests/support/triton_server.py`` runs under ``.triton-venv`` (``scripts/setup-triton-env``)
in its own process group, on free loopback ports. ``crash()`` SIGKILLs the
``tritonserver`` process of that group, as a real crash would; ``start()`` brings a new
one up on the same ports, so edge_vision's configured URL stays valid.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from edge_vision.engines.triton import ModelIO, TensorInfo

from .server import free_port
from .timing import T

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".triton-venv" / "bin" / "python"
SERVER_SCRIPT = Path(__file__).with_name("triton_server.py")
MODEL_REPOSITORY = REPO / "deploy" / "triton" / "model_repository"
PPOCR_CONFIG = MODEL_REPOSITORY / "ppocr_det" / "config.pbtxt"

# Extra models the server binds beside ppocr_det, each differing from config.pbtxt.
WRONG_NAME_MODEL = "ppocr_det_wrong_name"  # input "images" instead of "x"
WRONG_DIMS_MODEL = "ppocr_det_wrong_dims"  # input dims [3, 640, 640]: no dynamic shapes
WRONG_MODELS = (f"{WRONG_NAME_MODEL}:images:3,-1,-1", f"{WRONG_DIMS_MODEL}:x:3,640,640")

# What the log shows when a start lost pytriton's handshake race (see TritonProcess.start).
HANDSHAKE_RACE = "get_config_from_handshake_server"


def triton_env_missing() -> str | None:
    """Why the Triton tests cannot run here, or None."""
    if not VENV_PYTHON.exists():
        return f"{VENV_PYTHON} is missing: run scripts/setup-triton-env (scripts/test does)"
    return None


def _group_members(pgid: int) -> dict[int, str]:
    """pid -> command name of every live process in process group ``pgid``."""
    members: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members[int(entry.name)] = comm
    return members


class TritonProcess:
    """The pytriton wrapper and its ``tritonserver`` on free ports, started and killed here."""

    def __init__(self, workdir: Path, model_file: Path, model_config: Path = PPOCR_CONFIG) -> None:
        self.workdir = workdir
        self.model_file = model_file
        self.model_config = model_config
        self.grpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "run0" / "triton.log"
        self.workspace = workdir / "run0" / "workspace"
        self.starts = 0

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, attempts: int = 3) -> None:
        """Start the wrapper and its ``tritonserver``; return once every model is ready.

        A start that dies of pytriton's handshake race is tried again, up to ``attempts``
        in all. pytriton 0.7.0 has the first instance of a model open its handshake unix
        socket with ``asyncio.start_unix_server``, which binds (the file appears) before it
        listens; the second instance's stub polls for the file every millisecond and can
        connect in between, gets ECONNREFUSED, and the model fails to load. Seen once in
        CI on a loaded 2-core machine. Any other failure is raised at once.
        """
        for attempt in range(1, attempts + 1):
            self._launch()
            try:
                self._wait_ready()
                return
            except RuntimeError as exc:
                if attempt == attempts or HANDSHAKE_RACE not in str(exc):
                    raise
                log.warning("Triton start %d lost pytriton's handshake race; again", attempt)
                self._reap(grace=T(20))

    def _launch(self) -> None:
        self.starts += 1
        tmp = self.workdir / f"run{self.starts}"
        tmp.mkdir(parents=True)
        self.workspace = tmp / "workspace"
        self.log_path = tmp / "triton.log"  # one log per launch: log() tells this one's fate
        args = [
            str(VENV_PYTHON),
            str(SERVER_SCRIPT),
            "--model-file",
            str(self.model_file),
            "--config",
            str(self.model_config),
            "--grpc-port",
            str(self.grpc_port),
            "--http-port",
            str(self.http_port),
            "--metrics-port",
            str(self.metrics_port),
            "--workspace",
            str(self.workspace),
        ]
        for wrong in WRONG_MODELS:
            args += ["--wrong-model", wrong]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "TMPDIR": str(tmp)},
                start_new_session=True,  # its own process group: kill exactly what we started
            )

    def _wait_ready(self, timeout: float = 120) -> None:
        """Until every model answers ready over gRPC."""
        deadline = time.monotonic() + T(timeout)
        client = triton_grpc.InferenceServerClient(self.url)
        try:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    raise RuntimeError(f"Triton exited before it was ready:\n{self.log()}")
                try:
                    models = ("ppocr_det", WRONG_NAME_MODEL, WRONG_DIMS_MODEL)
                    if all(client.is_model_ready(m, client_timeout=1.0) for m in models):
                        return
                except InferenceServerException:
                    pass
                time.sleep(0.25)
        finally:
            client.close()
        raise TimeoutError(f"Triton not ready after {T(timeout)} s:\n{self.log()}")

    def log(self) -> str:
        if self.log_path.exists():
            return self.log_path.read_text(errors="replace")[-4000:]
        return ""

    @property
    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        return "tritonserver" in _group_members(self.proc.pid).values()

    def crash(self) -> None:
        """SIGKILL ``tritonserver`` (a crash: in-flight requests die with the connection);
        the wrapper sees it, cleans up and exits."""
        if self.proc is None:
            return
        for pid, comm in _group_members(self.proc.pid).items():
            if comm == "tritonserver":
                os.kill(pid, signal.SIGKILL)
        self._reap(grace=T(20))

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self._reap(grace=T(20))

    def _reap(self, grace: float) -> None:
        """Wait for the whole group to exit; SIGKILL what is left after ``grace``."""
        assert self.proc is not None
        pgid = self.proc.pid
        deadline = time.monotonic() + grace
        while _group_members(pgid) and time.monotonic() < deadline:
            self.proc.poll()
            time.sleep(0.1)
        if _group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)
        self.proc.wait()
        # Shared-memory regions the Python backend names after the wrapper's pid, left
        # behind only when the wrapper itself had to be killed.
        for leftover in Path("/dev/shm").glob(f"pytrtion{pgid}-*"):
            leftover.unlink(missing_ok=True)
        # tritonserver copies each Python-backend model to /tmp/folderXXXXXX (ignoring
        # TMPDIR) and leaves it there; ours name our workspace in their config.pbtxt.
        for folder in Path("/tmp").glob("folder*"):
            try:
                ours = str(self.workspace) in (folder / "config.pbtxt").read_text()
            except OSError:
                continue
            if ours:
                shutil.rmtree(folder, ignore_errors=True)

    def counts(self, model: str = "ppocr_det") -> TritonCounts:
        """Triton's cumulative statistics for ``model`` (KServe v2 statistics extension)."""
        client = triton_grpc.InferenceServerClient(self.url)
        try:
            stats = client.get_inference_statistics(model, client_timeout=5.0)
        finally:
            client.close()
        m = stats.model_stats[0]
        return TritonCounts(
            requests=int(m.inference_stats.success.count),
            inferences=int(m.inference_count),
            executions=int(m.execution_count),
            batch_sizes={int(b.batch_size): int(b.compute_infer.count) for b in m.batch_stats},
        )


@dataclass(frozen=True)
class TritonCounts:
    requests: int  # successful inference requests
    inferences: int  # frames inferred
    executions: int  # model executions: fewer than requests when Triton batched requests
    batch_sizes: dict[int, int]  # batch size Triton ran -> how many executions

    def since(self, before: TritonCounts) -> TritonCounts:
        return TritonCounts(
            self.requests - before.requests,
            self.inferences - before.inferences,
            self.executions - before.executions,
            {
                size: n - before.batch_sizes.get(size, 0)
                for size, n in self.batch_sizes.items()
                if n - before.batch_sizes.get(size, 0)
            },
        )


def config_model_io(config: Any) -> ModelIO:
    """What Triton will report for a ``config.pbtxt`` (a ``ModelConfig`` protobuf).

    Triton's metadata puts a ``-1`` batch dimension in front of ``dims`` when
    ``max_batch_size`` > 0, and names datatypes without the ``TYPE_`` prefix.
    """
    from tritonclient.grpc import model_config_pb2

    batch = (-1,) if config.max_batch_size > 0 else ()

    def info(t: Any) -> TensorInfo:
        name = model_config_pb2.DataType.Name(t.data_type).removeprefix("TYPE_")
        datatype = "BYTES" if name == "STRING" else name
        return TensorInfo(str(t.name), datatype, batch + tuple(int(d) for d in t.dims))

    return ModelIO(
        inputs=tuple(info(t) for t in config.input),
        outputs=tuple(info(t) for t in config.output),
        max_batch_size=int(config.max_batch_size),
    )
