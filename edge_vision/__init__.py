"""edge_vision: real-time computer vision over one WebSocket, for edge devices.

The folders are the parts, top to bottom (each imports only those below it; the import
contracts in pyproject.toml check it, docs/architecture.md maps every module)::

    tools/    replay, the bench load test, doctor, build-engine, token
    serve/    the HTTP/WebSocket shell, workers, admission limits, auth   client/
    state/    shared connection state (in process or Redis)
    session/  the sans-I/O session core: messages in and out, admission, versions
    frames/   the frame path: decode -> batch -> infer -> post -> track -> read
    engines/  every inference backend behind one interface, and the CUDA layer
    model/    the model's contract: its spec, input shape and letterbox, its heads
    config/   every setting, composed and validated
    common/   what every layer uses: metrics, memory budget, systemd, close codes, types

``cli.py`` is the ``edge-vision`` command; ``errors.py`` the one exception tree; ``web/``
the overlay page the server serves at ``/`` (package data, no Python).
"""

#: The package's one version: pyproject.toml reads it, ``edge-vision --version`` and
#: ``/readyz`` show it, and CHANGELOG.md says what each one changed. The protocol has its
#: own version (``hello``'s ``protocol``, session/versions.py).
__version__ = "0.2.0"
