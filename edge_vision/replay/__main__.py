"""``python -m edge_vision.replay INPUT ...``: the same as ``edge-vision replay``."""

from .command import main

raise SystemExit(main())
