"""jetson/: install.sh passes shellcheck and its --dry-run prints the plan; the unit verifies.

Nobody here has a Jetson, so the script cannot run for real: its dry run is what a test
can check (every step, in order, with the options given), and nothing may change.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.units import verify_unit

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "jetson" / "install.sh"
UNIT = REPO / "jetson" / "edge-vision.service"


def dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INSTALL), "--dry-run", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_install_sh_passes_shellcheck() -> None:
    done = subprocess.run(
        ["shellcheck", "--severity=style", str(INSTALL)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dry_run_prints_every_step_in_order_and_changes_nothing(tmp_path: Path) -> None:
    frames = tmp_path / "site-frames"
    frames.mkdir()
    before = {p: p.exists() for p in map(Path, ("/opt/edge-vision", "/etc/edge-vision"))}
    done = dry_run("--precision", "int8", "--calibration", str(frames), "--dla-core", "0")
    assert done.returncode == 0, done.stderr
    plan = [line for line in done.stdout.splitlines() if line.startswith("+ ")]
    expected_in_order = [
        "install -d -o edge-vision -g edge-vision /var/lib/edge-vision",
        "python3 -m venv --system-site-packages /opt/edge-vision/venv",
        "printf 'numpy<2\\n' > /opt/edge-vision/constraints.txt",
        "/opt/edge-vision/venv/bin/pip install -q -c /opt/edge-vision/constraints.txt "
        "/opt/edge-vision/src",
        "pycuda",
        f"set in /etc/edge-vision/config.yaml: precision=int8 calibration={frames} dla_core=0",
        "edge-vision build-engine --config /etc/edge-vision/config.yaml",
        "install -m 0644 ",
        "systemctl daemon-reload",
        "systemctl enable edge-vision.service",
        "systemctl restart edge-vision.service",
        "/readyz",
    ]
    at = 0
    for step in expected_in_order:
        found = next((i for i in range(at, len(plan)) if step in plan[i]), None)
        assert found is not None, f"{step!r} missing after line {at} of the plan:\n{done.stdout}"
        at = found + 1
    assert "sudo -u edge-vision" in next(p for p in plan if "build-engine" in p)
    assert "/etc/systemd/system/edge-vision.service" in next(
        p for p in plan if "0644" in p and "service" in p
    )
    assert "nothing was changed" in done.stdout
    assert {p: p.exists() for p in before} == before


def test_dry_run_still_refuses_bad_options() -> None:
    int8 = dry_run("--precision", "int8")
    assert int8.returncode == 2 and "needs --calibration" in int8.stderr
    bad = dry_run("--precision", "int4")
    assert bad.returncode == 2 and "fp16, int8 or fp32" in bad.stderr
    unknown = dry_run("--frobnicate")
    assert unknown.returncode == 2 and "unknown option --frobnicate" in unknown.stderr


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify checks that ExecStart exists: point it at this environment's edge-vision.
    exe = Path(sys.executable).parent / "edge-vision"
    exe_path = str(exe) if exe.exists() else shutil.which("edge-vision")
    assert exe_path, "edge-vision console script not installed (pip install -e .)"
    unit = UNIT.read_text().replace("/opt/edge-vision/venv/bin/edge-vision", exe_path)
    done = verify_unit(unit, tmp_path, "edge-vision.service")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NotifyAccess=main" in unit and "Type=notify" in unit
