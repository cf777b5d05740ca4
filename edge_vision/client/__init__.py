"""The Python client of the edge_vision protocol, for camera boxes and tools (docs/client.md).

::

    async with EdgeVisionClient("ws://node:8080/ws", token=TOKEN) as client:
        print(client.hello.model, client.hello.features)
        await client.settings(confidence=0.4)
        pending = await client.send(jpeg_bytes)       # a future, matched by frame id
        result = await pending                        # or: async for r in client.results()

What it does for you (docs/protocol.md):

* **connect** with ``Authorization: Bearer <token>`` when given, and ``?protocol=N``;
  HTTP 503 (warming up, full, stopping) and refused TCP connections are retried within
  ``retry_s``, waiting what ``Retry-After`` says (bounded by ``max_retry_wait_s``),
  else an exponential backoff;
* **hello** parsed into :class:`Hello`; **settings** answered with the effective
  :class:`Settings`; **frames** as JPEG/PNG bytes or numpy arrays (encoded to JPEG here),
  in the binary form or as JSON;
* **results matched by id**: answers come in the order frames were sent, so a result for a
  later frame settles every earlier one still waiting as dropped (latest-wins);
  :attr:`EdgeVisionClient.books` counts what became of the frames sent, and ``on_drop``
  hears of each drop as it is decided;
* **resume**: after the server's ``closing`` + 1001 (shutdown) or a lost connection, it
  reconnects (to any node behind the balancer) with the session's resume token; frames in
  flight then are dropped (the server counts them so too), later ones go to the new node;
* **events** (protocol 3): what the session's rules raise, as typed :class:`Event` values
  through :meth:`EdgeVisionClient.events` or an ``on_event`` callback;
* **every close reason is a typed exception** (edge_vision/errors.py, under
  :class:`~edge_vision.errors.ConnectionClosed`), raised by :meth:`results`, :meth:`send`
  and the futures of frames, settings and pings waiting then.
"""

from .connection import EdgeVisionClient
from .values import (
    Answer,
    Books,
    Counters,
    Detection,
    DropCause,
    Event,
    FrameError,
    FrameId,
    Hello,
    Limits,
    Result,
    Settings,
    Wire,
    jpeg_from_array,
)

__all__ = [
    "Answer",
    "Books",
    "Counters",
    "Detection",
    "DropCause",
    "EdgeVisionClient",
    "Event",
    "FrameError",
    "FrameId",
    "Hello",
    "Limits",
    "Result",
    "Settings",
    "Wire",
    "jpeg_from_array",
]
