"""The one exception tree of edge_vision.

    EdgeVisionError
    ├── ConfigError            bad configuration; stops start-up with a message naming the key
    ├── ModelError             a model file that cannot be used (missing, unsupported outputs)
    ├── EngineError            an engine failed to load or to run
    │   ├── EngineUnavailable  no engine can serve right now (GPU lost, Triton down, no fallback)
    │   └── EngineMismatch     the engine serves another model than the configured one (Triton's
    │                          model metadata differs from the ONNX model): stops start-up
    ├── FrameSuperseded        a newer frame of the same session took this one's place
    ├── StateUnavailable       the state store (Redis) cannot be reached; frames keep flowing
    ├── UnsupportedProtocol    a client asked for a protocol version this node does not serve
    │                          (HTTP 400 before the upgrade; edge_vision/versions.py)
    └── ClientError            bad input from one client; becomes an ``error`` message with a
                               stable ``code`` and never a traceback in the log

Programmer misuse raises ``TypeError`` / ``RuntimeError`` as usual.

The client error codes are part of the protocol (docs/protocol.md); they never change meaning.
"""

from __future__ import annotations

from typing import Final

#: Error codes sent to clients. Stable: clients may switch on them.
ERROR_CODES: Final[dict[str, str]] = {
    "bad_json": "the text message is not valid JSON",
    "bad_message": "the message is not a JSON object or its binary header is malformed",
    "unknown_type": "the message 'type' is not one the server knows",
    "bad_field": "a required field is missing or has the wrong type",
    "bad_base64": "the 'image' field is not valid base64",
    "bad_image": "the bytes are not a decodable JPEG or PNG image",
    "unsupported_image": "the image format is not JPEG or PNG",
    "image_too_large": "the image has more pixels than the server accepts",
    "bad_settings": "a settings value is out of range",
    "engine_unavailable": "no inference engine can serve the frame right now",
    "internal": "the server failed on this frame; the connection lives on",
}


class EdgeVisionError(Exception):
    """Base of every error edge_vision raises on purpose."""


class ConfigError(EdgeVisionError):
    """The configuration is invalid; the message names the key and the allowed values."""


class ModelError(EdgeVisionError):
    """A model cannot be loaded or its outputs match no known head."""


class EngineError(EdgeVisionError):
    """An engine failed to load or to run a batch."""


class EngineUnavailable(EngineError):
    """No engine can serve right now; frames are answered with ``engine_unavailable``."""


class EngineMismatch(EngineError):
    """The engine's model contradicts the configured one (input/output names, dtypes, dims).

    A configuration error, not an outage: start-up stops even when a fallback engine is
    configured, because serving on the fallback would hide it.
    """


class FrameSuperseded(EdgeVisionError):
    """A newer frame of the same latest-wins session took this frame's place before it
    reached the engine; the frame is counted as dropped, not answered."""


class StateUnavailable(EdgeVisionError):
    """The state store cannot be reached; state is degraded, frames keep flowing."""


class UnsupportedProtocol(EdgeVisionError):
    """A client asked for a protocol version this node does not serve (``?protocol=``)."""

    def __init__(self, asked: str, supported: tuple[int, ...]) -> None:
        served = ", ".join(map(str, supported))
        super().__init__(f"protocol {asked!r} is not served; this node serves {served}")
        self.asked = asked
        self.supported = supported


class ClientError(EdgeVisionError):
    """Bad input from a client: answered with an ``error`` message, the connection lives on."""

    def __init__(self, code: str, message: str, frame_id: object = None) -> None:
        if code not in ERROR_CODES:
            raise RuntimeError(f"unknown client error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.frame_id = frame_id

    def with_frame_id(self, frame_id: object) -> ClientError:
        """The same error, attributed to a frame whose id became known later."""
        return ClientError(self.code, self.message, frame_id)
