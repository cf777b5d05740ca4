"""``python -m edge_vision.tools.replay INPUT ...``: the same as ``edge-vision replay``."""

from .command import main

raise SystemExit(main())
