"""The overlay page's layout at a desktop, a phone held upright and a phone on its side, read
from the elements' bounding boxes in headless Chromium against the real service (issue 33):
the label of the read-text box sits above its box instead of wrapping round it; the heads-up
display keeps to one line a row over the picture on a desktop and to one line under it on a
phone on its side, and on a phone never covers the picture; ticking Read (as a
user does: scrolled to, then tapped) leaves the picture on screen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

from ..support.browser import PageOpener, wait_for_hud
from ..support.server import ServerProcess
from ..support.timing import T

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

BOXES_SHOWN = "h.state === 'open' && h.boxes >= 2"
VIEWPORTS = {
    "desktop": dict(width=1280, height=800, scale=1, mobile=False),
    "phone-portrait": dict(width=390, height=844, scale=3, mobile=True),
    "phone-landscape": dict(width=844, height=390, scale=3, mobile=True),
}

# Rectangles in CSS pixels, from the page: [left, top, right, bottom].
_GEOMETRY = """() => {
  const box = (el) => { const r = el.getBoundingClientRect();
                        return [r.left, r.top, r.right, r.bottom]; };
  const textarea = document.getElementById('read-texts');
  const label = textarea.closest('label');
  // The label's own words: every line box of its text nodes (not the box inside it).
  const words = [];
  for (const node of label.childNodes) {
    if (node.nodeType !== Node.TEXT_NODE || !node.textContent.trim()) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    for (const r of range.getClientRects()) words.push([r.left, r.top, r.right, r.bottom]);
  }
  const hud = document.getElementById('hud');
  const shown = (el) => el.getClientRects().length > 0;
  const rows = [...hud.querySelectorAll('dd')].filter(shown).map((dd) => ({
    id: dd.id, box: box(dd), lines: Math.round(dd.getBoundingClientRect().height /
                                               parseFloat(getComputedStyle(dd).lineHeight)),
  }));
  // Whether the HUD is painted over any part of the picture on screen: hit-test a grid over
  // the picture's visible part (the HUD lets clicks through; for the test it takes them).
  const vr = document.getElementById('video').getBoundingClientRect();
  hud.style.pointerEvents = 'auto';
  let covers = 0;
  for (let x = Math.max(0, vr.left) + 1; x < Math.min(innerWidth, vr.right); x += 6) {
    for (let y = Math.max(0, vr.top) + 1; y < Math.min(innerHeight, vr.bottom); y += 3) {
      const at = document.elementFromPoint(x, y);
      if (at && hud.contains(at)) covers += 1;
    }
  }
  hud.style.pointerEvents = '';
  const read = document.getElementById('read');
  const rr = read.getBoundingClientRect();
  const atRead = document.elementFromPoint((rr.left + rr.right) / 2, (rr.top + rr.bottom) / 2);
  return {
    viewport: [innerWidth, innerHeight], words, textarea: box(textarea), label: box(label),
    hud: box(hud), hudCovers: covers, hudLine: parseFloat(getComputedStyle(hud).lineHeight), rows,
    video: box(document.getElementById('video')),
    readReachable: atRead === read || (atRead !== null && atRead.contains(read))
                   || read.labels[0].contains(atRead),
  };
}"""


def geometry(page: Page) -> dict[str, Any]:
    got: dict[str, Any] = page.evaluate(_GEOMETRY)
    return got


def intersects(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def assert_label_above_its_box(g: dict[str, Any]) -> None:
    """Every line of the label's words lies wholly above the text box, which starts at the
    label's left edge (under the words, not beside them)."""
    assert g["words"], "the label has no text"
    box = g["textarea"]
    for line in g["words"]:
        assert line[3] <= box[1] + 0.5, f"label text {line} runs beside its box {box}"
        assert not intersects(line, box)
    assert abs(box[0] - g["label"][0]) <= 1, f"box {box} does not start under its label"


def assert_hud_fits(name: str, g: dict[str, Any]) -> None:
    rows, hud, video = g["rows"], g["hud"], g["video"]
    assert any(r["id"] == "hud-boxes" for r in rows), "the HUD hides its box count"
    if name != "phone-portrait":  # upright, under the picture, a long row may wrap
        for row in rows:
            assert row["lines"] == 1, f"HUD row {row['id']} takes {row['lines']} lines"
    if name == "desktop":
        # Over the picture by design, as a small block in its top-left corner.
        assert hud[3] - hud[1] <= 0.25 * (video[3] - video[1]), f"HUD {hud} over {video}"
        return
    assert g["hudCovers"] == 0, f"the HUD {hud} covers the picture {video}"
    if name == "phone-landscape":
        height = hud[3] - hud[1]
        assert height <= 1.6 * g["hudLine"], f"HUD is {height:.0f} px: more than one line"
        for row in rows:  # nothing of the one line is cut off at the edge
            assert row["box"][2] <= hud[2] + 0.5, f"HUD row {row['id']} runs off the edge"


@pytest.mark.parametrize("name", list(VIEWPORTS))
def test_layout_keeps_the_label_the_hud_and_the_picture_where_they_belong(
    name: str, page_server: ServerProcess, open_page: PageOpener, screenshots: Path
) -> None:
    page, console = open_page(page_server.url + "/", **VIEWPORTS[name])
    wait_for_hud(page, BOXES_SHOWN)
    before = geometry(page)
    assert_label_above_its_box(before)
    assert_hud_fits(name, before)

    # Tick Read as a user would: Playwright scrolls the box into view, then clicks it.
    page.check("#read")
    page.locator('#server-settings[data-read="true"]').wait_for(timeout=T(40) * 1000)
    page.wait_for_function(
        "() => document.getElementById('read-texts').value.length > 0", timeout=T(30) * 1000
    )
    after = geometry(page)
    width, height = after["viewport"]
    video = after["video"]
    assert video[1] >= -0.5 and video[3] <= height + 0.5, (
        f"after ticking Read the picture {video} is out of the {width}x{height} view"
    )
    assert after["readReachable"], "the Read box is covered (by the picture?)"
    assert_label_above_its_box(after)
    assert_hud_fits(name, after)
    page.screenshot(path=screenshots / f"layout-{name}-reading.png")
    console.assert_clean()
