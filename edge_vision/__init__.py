"""edge_vision: real-time computer vision over one WebSocket, for edge devices.

The package reads like the path of one frame::

    receive -> admit -> decode -> shape -> batch -> infer -> post -> reply

(admit is ``session_core``, the one sans-I/O home of admission, superseding, reply order
and the books), with ``pipeline`` joining the stages for one frame, ``connection`` and
``server`` as the thin asyncio shell, ``supervisor`` choosing and keeping the engine that
``infer`` batches onto, ``engines/`` behind one interface, ``state/`` for shared
connection state and ``config`` holding every setting.
"""

__version__ = "0.1.0"
