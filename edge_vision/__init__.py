"""edge_vision: real-time computer vision over one WebSocket, for edge devices.

The folders are the parts, top to bottom (each imports only those below it; the import
contracts in pyproject.toml check it, docs/architecture.md maps every module)::

    tools/    replay, the bench load test, doctor, build-engine
    serve/    the HTTP/WebSocket shell, workers, admission limits, auth   client.py
    state/    shared connection state (in process or Redis)
    session/  the sans-I/O session core: messages in and out, admission, versions
    frames/   the frame path: decode -> batch -> infer -> post -> track -> read
    engines/  every inference backend behind one interface, and the CUDA layer
    model/    the model's contract: its spec, input shape and letterbox, its heads
    config.py every setting, composed and validated
    common/   what every layer uses: metrics, memory budget, systemd, close codes, types

``cli.py`` is the ``edge-vision`` command; ``errors.py`` the one exception tree.
"""

__version__ = "0.1.0"
