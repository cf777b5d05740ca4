"""The JavaScript client as a web developer installs it (docs/js-client.md): `npm pack` of
edge_vision/web/client, `npm install` of that tarball into a fresh project (offline: it has
no dependencies), `import` in Node, TypeScript compiled against its types; and the parts
that must agree with the Python side do: its error classes (names, tree, which are
resumable) with edge_vision/errors.py, its binary frame with the server's parser, its version
with the package's.

Node and npm come from Debian; TypeScript from .npm-tools/ (scripts/test installs both).
"""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import edge_vision
from edge_vision import errors
from edge_vision.session.receive import parse_binary

from ..support.timing import T

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "edge_vision" / "web" / "client"
TSC = REPO / ".npm-tools" / "node_modules" / ".bin" / "tsc"
SHIPPED = {
    "package.json",
    "index.js",
    "index.d.ts",
    "client.js",
    "errors.js",
    "wire.js",
    "README.md",
}

# Run in Node from the installed package: its exports, each error class's place in the tree
# and whether it is resumable, a close classified, a binary frame as bytes.
NODE_CHECK = """
import * as ev from "edge-vision-client";
const errorClasses = {};
for (const [name, value] of Object.entries(ev)) {
  if (typeof value !== "function" || !(value.prototype instanceof Error)) continue;
  const base = ev.ProtocolClientError;
  if (value !== base && !(value.prototype instanceof base)) continue;
  const parent = Object.getPrototypeOf(value).name;
  const closed = value.prototype instanceof ev.ConnectionClosed || value === ev.ConnectionClosed;
  errorClasses[name] = {parent, resumable: closed ? new value(1000, "").resumable : null};
}
const frame = ev.encodeBinaryFrame(7, 1.5, new Uint8Array([0xff, 0xd8, 0x61, 0x62]));
console.log(JSON.stringify({
  exports: Object.keys(ev).sort(),
  errorClasses,
  superseded: ev.classifyClose(4000, "", null).name,
  shutdown: ev.classifyClose(1001, "", "tok").resumeToken,
  frame: Buffer.from(frame).toString("hex"),
  client: typeof ev.EdgeVisionClient,
}));
"""

USER_CODE = """
import { EdgeVisionClient, FrameDropped, type Result } from "edge-vision-client";

export async function run(canvas: HTMLCanvasElement): Promise<number> {
  const options = { token: () => "ev1.x", retryMs: 5000 };
  const client = new EdgeVisionClient("ws://edge-box:8080/ws", options);
  await client.connect();
  try {
    const result: Result = await client.detect(canvas, { wire: "binary" });
    return result.detections.filter((d) => d.score > 0.5 && d.track !== undefined).length;
  } catch (e) {
    if (e instanceof FrameDropped) return -1;
    throw e;
  }
}
"""

# Misuse the declarations must refuse: each line needs its error, or tsc fails on the
# unused directive.
MISUSE = """
import { EdgeVisionClient } from "edge-vision-client";

export async function misuse(client: EdgeVisionClient): Promise<void> {
  // @ts-expect-error: a number is no frame
  await client.send(42);
  // @ts-expect-error: no such mode
  new EdgeVisionClient("ws://h/ws", { mode: "sometimes" });
  // @ts-expect-error: results carry detections, not boxes
  (await client.detect(new Blob())).boxes;
  // @ts-expect-error: books are read-only counts, pending is derived
  client.books.pending = 3;
}
"""


def run(argv: list[str], cwd: Path) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=T(60))
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh npm project with the packed client installed from its tarball."""
    npm = shutil.which("npm")
    assert npm and shutil.which("node"), "node and npm are not installed; scripts/test does it"
    work = tmp_path_factory.mktemp("js")
    packed = json.loads(
        run([npm, "pack", str(PACKAGE), "--json", "--pack-destination", str(work)], work)
    )[0]
    assert {f["path"] for f in packed["files"]} == SHIPPED, "the tarball ships other files"
    app = work / "app"
    app.mkdir()
    (app / "package.json").write_text('{"name": "app", "private": true, "type": "module"}\n')
    quiet = ["--offline", "--no-audit", "--no-fund", "--loglevel=error"]
    run([npm, "install", *quiet, str(work / packed["filename"])], app)
    return app


def test_it_installs_from_its_tarball_and_imports_in_node(installed: Path) -> None:
    out: dict[str, Any] = json.loads(
        run(["node", "--input-type=module", "-e", NODE_CHECK], installed)
    )
    assert out["client"] == "function"
    assert {"EdgeVisionClient", "PROTOCOL_VERSION", "encodeBinaryFrame"} <= set(out["exports"])
    assert out["superseded"] == "SessionSuperseded" and out["shutdown"] == "tok"
    # The frame Node encodes is the frame the server parses.
    frame = parse_binary(bytes.fromhex(out["frame"]), 0.0)
    assert (frame.id, frame.ts, frame.image) == (7, 1.5, b"\xff\xd8ab")

    # The same error classes as the Python client's, in the same tree, resumable alike.
    python: dict[str, Any] = {}
    for name, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, errors.ProtocolClientError):
            closed = issubclass(cls, errors.ConnectionClosed)
            python[name] = {
                "parent": cls.__bases__[0].__name__,
                "resumable": bool(cls.resumable) if closed else None,
            }
    assert out["errorClasses"] == python


def test_typescript_compiles_against_its_types_and_refuses_misuse(installed: Path) -> None:
    assert TSC.exists(), f"{TSC} is missing: scripts/test installs typescript into .npm-tools/"
    (installed / "main.ts").write_text(USER_CODE)
    (installed / "misuse.ts").write_text(MISUSE)
    config = {
        "compilerOptions": {
            "target": "ES2022",
            "module": "NodeNext",
            "moduleResolution": "NodeNext",
            "lib": ["ES2022", "DOM"],
            "strict": True,
            "noEmit": True,
            "types": [],
        },
        "files": ["main.ts", "misuse.ts"],
    }
    (installed / "tsconfig.json").write_text(json.dumps(config))
    run([str(TSC), "-p", str(installed)], installed)


def test_the_package_version_is_the_wheels() -> None:
    manifest = json.loads((PACKAGE / "package.json").read_text())
    assert manifest["version"] == edge_vision.__version__
    assert manifest["types"] == "./index.d.ts" and manifest["type"] == "module"
