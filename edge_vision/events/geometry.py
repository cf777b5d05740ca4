"""Zones, lines and anchors: plane geometry in fractions of the frame. Pure, no I/O.

Coordinates are fractions of the frame's width and height, 0..1, x to the right and y
down, so one zone fits every frame size a camera sends. A detection is placed by one
point of its box, its *anchor*: the bottom centre by default (where an object stands on
the floor, as Frigate places objects in zones), or the centre.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Point = tuple[float, float]
Anchor = Literal["bottom_center", "center"]
Direction = Literal["forward", "backward"]


def anchor_point(box: Sequence[float], width: int, height: int, anchor: Anchor) -> Point:
    """The anchor of ``box`` (``x1, y1, x2, y2`` in frame pixels) of a ``width`` ×
    ``height`` frame, as fractions of the frame."""
    x1, y1, x2, y2 = box[0], box[1], box[2], box[3]
    x = (x1 + x2) / 2.0
    y = y2 if anchor == "bottom_center" else (y1 + y2) / 2.0
    return (x / width if width else 0.0, y / height if height else 0.0)


@dataclass(frozen=True, slots=True)
class Zone:
    """A named polygon (its points in order, either way round; closed implicitly)."""

    name: str
    points: tuple[Point, ...]

    def contains(self, p: Point) -> bool:
        """Whether ``p`` lies inside or on the border (even-odd rule: a ray to the right
        crosses the border an odd number of times). The border counts as inside, so a
        box standing on the frame's bottom edge is in a zone drawn down to it."""
        x, y = p
        inside = False
        pts = self.points
        xj, yj = pts[-1]
        for xi, yi in pts:
            # On this edge: collinear with it and within its extent.
            if (
                (xj - xi) * (y - yi) == (yj - yi) * (x - xi)
                and min(xi, xj) <= x <= max(xi, xj)
                and min(yi, yj) <= y <= max(yi, yj)
            ):
                return True
            if (yi > y) != (yj > y) and x < xi + (y - yi) * (xj - xi) / (yj - yi):
                inside = not inside
            xj, yj = xi, yi
        return inside


@dataclass(frozen=True, slots=True)
class Line:
    """A named line segment from ``a`` to ``b``.

    Its sides are named walking from ``a`` to ``b`` on the picture (y down): crossing
    from its left to its right is ``forward``, the other way ``backward``. For a line
    drawn from left to right, forward is downwards."""

    name: str
    a: Point
    b: Point

    def side(self, p: Point) -> float:
        """> 0 on the right of the line, < 0 on its left, 0 on it (the cross product of
        a→b and a→p, in y-down coordinates)."""
        (ax, ay), (bx, by) = self.a, self.b
        return (bx - ax) * (p[1] - ay) - (by - ay) * (p[0] - ax)

    def crossing(self, p0: Point, p1: Point) -> Direction | None:
        """The direction in which a point moving from ``p0`` to ``p1`` crosses the
        segment, or None when it does not (it stays on one side, or passes beyond an
        end). ``p0`` and ``p1`` on the line itself cross nothing."""
        s0, s1 = self.side(p0), self.side(p1)
        if s0 == 0 or s1 == 0 or (s0 > 0) == (s1 > 0):
            return None
        # The segment p0-p1 must meet a-b between its ends: a and b on either side of it.
        (ax, ay), (bx, by) = self.a, self.b
        dx, dy = p1[0] - p0[0], p1[1] - p0[1]
        ta = dx * (ay - p0[1]) - dy * (ax - p0[0])
        tb = dx * (by - p0[1]) - dy * (bx - p0[0])
        if ta != 0 and tb != 0 and (ta > 0) == (tb > 0):
            return None
        return "forward" if s1 > 0 else "backward"
