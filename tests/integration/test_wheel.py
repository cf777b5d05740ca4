"""The wheel is the product: built from this tree, installed in a fresh virtual environment
outside the clone, `edge-vision serve` run from another directory serves the overlay page
and its scripts, and says its version.

The environment sees the test machine's packages (``--system-site-packages``), so nothing
is downloaded but the wheel's build requirements; the check below that ``edge_vision`` is
imported from the new environment, not from this checkout, keeps that honest.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edge_vision.tools.bench.servers import stop_process

from ..support.server import free_port
from ..support.timing import T

pytestmark = pytest.mark.timeout(T(240))

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Installed:
    wheel: Path
    venv: Path
    elsewhere: Path  # a directory with nothing of the project in it

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def env(self) -> dict[str, str]:
        """This environment without PYTHONPATH, which would put a checkout first."""
        return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _tree_as_cloned(dest: Path) -> Path:
    """The files a clone of this tree has (tracked, plus new files git does not ignore),
    so no build/ left over from an earlier build can slip into the wheel. Outside a git
    checkout: what the build reads, less caches."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:
        dest.mkdir(parents=True)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / name, dest / name)
        shutil.copytree(
            REPO / "edge_vision",
            dest / "edge_vision",
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
        )
        return dest
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = REPO / rel
        if src.is_file():  # a file deleted but not yet committed is listed and absent
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("wheel")
    source = _tree_as_cloned(root / "source")
    dist = root / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)],
        check=True,
        timeout=T(180),
    )
    (wheel,) = dist.glob("edge_vision-*.whl")
    venv = root / "venv"
    # No pip of its own: the system's pip, run by the new interpreter, installs into it.
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
        check=True,
        timeout=T(120),
    )
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    yield Installed(wheel, venv, elsewhere)


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=T(5)) as r:
            return r.status, r.headers.get_content_type(), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get_content_type(), e.read()


def test_the_installed_package_is_the_wheel_not_the_checkout(installed: Installed) -> None:
    out = subprocess.run(
        [str(installed.bin / "python"), "-c", "import edge_vision; print(edge_vision.__file__)"],
        cwd=installed.elsewhere,
        env=installed.env,
        capture_output=True,
        text=True,
        check=True,
    )
    where = Path(out.stdout.strip())
    assert where.is_relative_to(installed.venv), f"edge_vision imported from {where}"
    assert (where.parent / "web" / "index.html").is_file()


def test_version_is_the_wheels_version(installed: Installed) -> None:
    out = subprocess.run(
        [str(installed.bin / "edge-vision"), "--version"],
        cwd=installed.elsewhere,
        env=installed.env,
        capture_output=True,
        text=True,
        check=True,
    )
    wheel_version = installed.wheel.name.split("-")[1]
    assert out.stdout.strip() == f"edge-vision {wheel_version}"


def test_serve_from_another_directory_serves_the_page_and_its_scripts(
    installed: Installed, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    argv = [str(installed.bin / "edge-vision"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            cwd=installed.elsewhere,
            env=installed.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + T(60)
        ready: dict[str, object] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, _, body = _get(f"{base}/readyz")
            except OSError:  # not listening yet
                time.sleep(0.2)
                continue
            ready = json.loads(body)
            if status == 200:
                break
            time.sleep(0.2)
        assert ready.get("ready") is True, f"not ready: {ready}\n{log.read_text()[-3000:]}"
        assert ready["version"] == installed.wheel.name.split("-")[1]

        status, ctype, page = _get(f"{base}/")
        assert (status, ctype) == (200, "text/html"), log.read_text()[-3000:]
        assert b'src="/static/app.js"' in page  # the script the page loads ...

        status, ctype, script = _get(f"{base}/static/app.js")  # ... is served too
        assert status == 200
        assert ctype in ("text/javascript", "application/javascript")
        assert b"import" in script  # an ES module, not an error page

        status, ctype, _ = _get(f"{base}/static/style.css")
        assert (status, ctype) == (200, "text/css")

        # The JavaScript client the page imports, for any page to import (docs/js-client.md),
        # with its types and its package.json beside it.
        for name in ("index.js", "client.js", "errors.js", "wire.js"):
            status, ctype, script = _get(f"{base}/static/client/{name}")
            assert status == 200 and ctype in ("text/javascript", "application/javascript")
            assert b"export" in script, name
        for name in ("index.d.ts", "package.json"):
            assert _get(f"{base}/static/client/{name}")[0] == 200, name
    finally:
        stop_process(proc, signal.SIGTERM, T(15))
