"""``python -m edge_vision.replay INPUT ...``: the same as ``edge-vision replay`` (the name
scripts have used since the first release); the code is :mod:`edge_vision.tools.replay`."""

if __name__ == "__main__":
    from .tools.replay.command import main

    raise SystemExit(main())
