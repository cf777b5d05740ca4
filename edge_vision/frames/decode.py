"""Stage 3, decode: encoded image bytes → BGR pixels in a reusable host buffer.

Order of work for one frame, cheapest refusal first:

1. :func:`read_image_header` reads width/height from the JPEG SOF or PNG IHDR segment
   without decoding, so an oversized image (a 40 000 × 40 000 PNG) is refused at once;
2. the decoder writes pixels into a :class:`BufferPool` buffer (pinned memory when a
   CUDA engine installed a pinned allocator), never a fresh array per frame where the
   decoder allows it (simplejpeg does);
3. JPEG frames much larger than the engine input are scaled by 1/2, 1/4 or 1/8 inside
   libjpeg's IDCT (DCT-domain downscaling), which is cheaper than decoding then resizing.

Decoders, fastest first: simplejpeg (libjpeg-turbo), PyTurboJPEG, OpenCV, Pillow.
"""

from __future__ import annotations

import binascii
import io
import logging
import struct
from base64 import b64decode
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from ..common.buffers import BufferPool
from ..errors import ClientError, ConfigError

log = logging.getLogger(__name__)

U8Array = npt.NDArray[np.uint8]
ImageFormat = Literal["jpeg", "png"]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# SOF markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


@dataclass(frozen=True, slots=True)
class ImageHeader:
    format: ImageFormat
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def read_image_header(data: bytes) -> ImageHeader:
    """Width and height from the header alone (JPEG: ITU T.81 B.2.2 SOF; PNG: IHDR)."""
    if data.startswith(_PNG_SIGNATURE):
        # IHDR must be the first chunk: length(4) 'IHDR'(4) width(4) height(4) ...
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise ClientError("bad_image", "PNG without a valid IHDR chunk")
        width, height = struct.unpack_from(">II", data, 16)
        if width == 0 or height == 0:
            raise ClientError("bad_image", "PNG with zero width or height")
        return ImageHeader("png", width, height)
    if data.startswith(b"\xff\xd8"):
        return _jpeg_header(data)
    raise ClientError("unsupported_image", "image is neither JPEG nor PNG (by its first bytes)")


def _jpeg_header(data: bytes) -> ImageHeader:
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            raise ClientError("bad_image", f"JPEG marker expected at byte {i}")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # standalone markers
            i += 2
            continue
        (length,) = struct.unpack_from(">H", data, i + 2)
        if length < 2:
            raise ClientError("bad_image", "JPEG segment with invalid length")
        if marker in _SOF_MARKERS:
            if i + 9 > n:
                break
            height, width = struct.unpack_from(">HH", data, i + 5)
            if width == 0 or height == 0:
                raise ClientError("bad_image", "JPEG with zero width or height")
            return ImageHeader("jpeg", width, height)
        if marker == 0xDA:  # start of scan before any SOF
            raise ClientError("bad_image", "JPEG scan before frame header")
        i += 2 + length
    raise ClientError("bad_image", "JPEG is truncated before its frame header")


def _megapixels(pixels: int) -> str:
    return f"{pixels / 1e6:.1f} MP" if pixels >= 100_000 else f"{pixels:,} pixels"


def _mebibytes(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes:,} bytes"


def check_pixel_limit(header: ImageHeader, max_pixels: int) -> None:
    """Refuse, from the header, an image of more than ``max_pixels`` (``server.max_pixels``);
    the message says what the client can do about it."""
    if header.pixels > max_pixels:
        raise ClientError(
            "image_too_large",
            f"image is {header.width}x{header.height} ({_megapixels(header.pixels)}); this "
            f"server takes at most {_megapixels(max_pixels)} (server.max_pixels): scale the "
            "frame down",
        )


def decoded_bytes(header: ImageHeader, min_size: tuple[int, int] | None) -> int:
    """Bytes of the BGR pixels a decoder will produce: JPEG may be DCT-downscaled (to
    no less than ``min_size``), PNG never is. Known from the header, before decoding."""
    scale = _jpeg_scale(header, min_size) if header.format == "jpeg" else 1
    return -(-header.width // scale) * -(-header.height // scale) * 3


def check_decoded_limit(
    header: ImageHeader, min_size: tuple[int, int] | None, max_bytes: int
) -> int:
    """Refuse, before decoding, an image whose pixels would take more than ``max_bytes``
    (``server.max_decoded_bytes``; by default every image within ``server.max_pixels``
    fits, config/serve.py says when it is less). Returns the decoded size.

    A PNG decodes whole (3 bytes a pixel); a JPEG may be scaled down in the DCT, so the
    message offers JPEG where that is on (``min_size`` given)."""
    nbytes = decoded_bytes(header, min_size)
    if nbytes > max_bytes:
        kind = header.format.upper()
        largest = f", so a {kind} of at most {_megapixels(max_bytes // 3)}"
        if header.format == "jpeg" and min_size is not None:
            largest = ""  # how far it scales depends on the frame's shape, not a pixel count
        todo = "scale the frame down"
        if header.format == "png" and min_size is not None:
            todo += ", or send it as JPEG (decoded scaled down)"
        raise ClientError(
            "decoded_too_large",
            f"{kind} {header.width}x{header.height} ({_megapixels(header.pixels)}) would "
            f"decode to {_mebibytes(nbytes)}; this server decodes at most "
            f"{_mebibytes(max_bytes)} a frame (server.max_decoded_bytes){largest}: {todo}",
        )
    return nbytes


# ---------------------------------------------------------------------------------------
# What a decode holds, from the header, before it starts

# Progressive SOFs (Huffman and arithmetic, plain and differential): libjpeg buffers the
# coefficients of the whole image until the last scan.
_PROGRESSIVE_SOF = frozenset((0xC2, 0xC6, 0xCA, 0xCE))
_COEFFICIENT_BLOCK = 64 * 2  # one 8x8 block of 16-bit coefficients (libjpeg's JBLOCK)


@dataclass(frozen=True, slots=True)
class JpegLayout:
    """What decides a JPEG decoder's working memory: the frame's SOF marker, each
    component's sampling factors, and how many components its first scan carries."""

    sof: int
    sampling: tuple[tuple[int, int], ...]  # (horizontal, vertical) per component
    first_scan_components: int | None  # None: no scan header before the data ends

    @property
    def whole_image_buffers(self) -> bool:
        """Progressive, or sequential in several scans (a component's scan comes after
        another's): libjpeg keeps every coefficient of the image until the end (its
        buffered-image mode, jdcoefct.c), however far it scales the output down."""
        multi_scan = self.first_scan_components is not None and self.first_scan_components < len(
            self.sampling
        )
        return self.sof in _PROGRESSIVE_SOF or multi_scan


def jpeg_layout(data: bytes) -> JpegLayout | None:
    """The :class:`JpegLayout` from the markers before the first scan (ITU T.81 B.2.2
    frame header, B.2.3 scan header); None when they cannot be read (the decoder then
    says what is wrong)."""
    i, n = 2, len(data)
    sof: int | None = None
    sampling: tuple[tuple[int, int], ...] = ()
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF or marker in (0x01, *range(0xD0, 0xD8)):
            i += 1 if marker == 0xFF else 2
            continue
        (length,) = struct.unpack_from(">H", data, i + 2)
        if marker in _SOF_MARKERS and i + 10 <= n:
            count = data[i + 9]
            if i + 10 + 3 * count > n:
                return None
            factors = data[i + 11 : i + 10 + 3 * count : 3]
            sof, sampling = marker, tuple((f >> 4, f & 0x0F) for f in factors)
        elif marker == 0xDA:  # start of scan: Ns, the components of this first scan
            if sof is None or i + 5 > n:
                return None
            return JpegLayout(sof, sampling, data[i + 4])
        i += 2 + length
    return JpegLayout(sof, sampling, None) if sof is not None else None


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def decode_memory(data: bytes, header: ImageHeader, min_size: tuple[int, int] | None) -> int:
    """Bytes a host decode of ``data`` holds at its peak, from its header alone: the
    decoded pixels (:func:`decoded_bytes`), plus a JPEG's whole-image coefficient
    buffers when it has them (a progressive 6,300 x 6,300 JPEG of 0.5 MB holds 227 MiB
    while it decodes to 1.8 MiB at 1/8), plus a 16-bit PNG's 16-bit pixels (decoded
    before they are narrowed to 8 bits). What the memory budget is charged before the
    decode starts (edge_vision.frames.decode_turns)."""
    nbytes = decoded_bytes(header, min_size)
    if header.format == "png":
        if len(data) > 24 and data[24] == 16:  # IHDR bit depth
            nbytes += header.pixels * 3 * 2
        return nbytes
    layout = jpeg_layout(data)
    if layout is None or not layout.whole_image_buffers or not layout.sampling:
        return nbytes
    h_max = max(h for h, _ in layout.sampling) or 1
    v_max = max(v for _, v in layout.sampling) or 1
    for h, v in layout.sampling:
        # Blocks of this component, padded to whole MCUs as libjpeg allocates them.
        h, v = max(h, 1), max(v, 1)
        cols = _ceil_div(_ceil_div(header.width * h, h_max), 8)
        rows = _ceil_div(_ceil_div(header.height * v, v_max), 8)
        nbytes += _ceil_div(cols, h) * h * _ceil_div(rows, v) * v * _COEFFICIENT_BLOCK
    return nbytes


def decode_refusal(
    header: ImageHeader, data: bytes, nbytes: int, budget: int, *, ever: bool
) -> ClientError:
    """The error for a decode that must hold ``nbytes`` (:func:`decode_memory`) when the
    memory budget (``budget`` bytes, ``server.memory_budget_bytes``) has no room for it:
    now (``ever``: it fits an idle node; over_memory_budget), or never (decoded_too_large)."""
    layout = jpeg_layout(data) if header.format == "jpeg" else None
    kind = header.format.upper()
    if layout is not None and layout.sof in _PROGRESSIVE_SOF:
        kind = "progressive JPEG"
    what = (
        f"decoding this {kind} {header.width}x{header.height} ({_megapixels(header.pixels)}) "
        f"holds {_mebibytes(nbytes)}"
    )
    setting = f"the server's memory budget ({_mebibytes(budget)}, server.memory_budget_bytes)"
    if ever:
        return ClientError(
            "over_memory_budget",
            f"{what}; {setting} has no room for it now: retry shortly, or send smaller frames",
        )
    todo = "send a smaller frame" + (", or a baseline JPEG" if header.format == "jpeg" else "")
    return ClientError("decoded_too_large", f"{what}, more than {setting}: {todo}")


# ---------------------------------------------------------------------------------------
# Decoders


@dataclass(slots=True)
class DecodedFrame:
    """Pixels (BGR, HxWx3) possibly DCT-downscaled; width/height are the original's."""

    pixels: U8Array
    width: int
    height: int
    pooled: bool  # pixels view a BufferPool buffer that must be released


class Decoder(Protocol):
    name: str

    def decode(
        self, data: bytes, header: ImageHeader, min_size: tuple[int, int] | None, pool: BufferPool
    ) -> DecodedFrame:
        """Decode ``data``; ``min_size`` (w, h) allows DCT downscaling down to that size."""
        ...


def _jpeg_scale(header: ImageHeader, min_size: tuple[int, int] | None) -> int:
    """Largest libjpeg scale denominator (1, 2, 4, 8) that keeps both sides >= min_size."""
    if min_size is None:
        return 1
    mw, mh = min_size
    for d in (8, 4, 2):
        if -(-header.width // d) >= mw and -(-header.height // d) >= mh:
            return d
    return 1


def _opencv_decode(data: bytes, header: ImageHeader, scale: int) -> U8Array:
    import cv2

    flags = {
        1: cv2.IMREAD_COLOR,
        2: cv2.IMREAD_REDUCED_COLOR_2,
        4: cv2.IMREAD_REDUCED_COLOR_4,
        8: cv2.IMREAD_REDUCED_COLOR_8,
    }[scale if header.format == "jpeg" else 1]
    img = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    if img is None:
        raise ClientError("bad_image", f"{header.format.upper()} data could not be decoded")
    if img.ndim != 3 or img.shape[2] != 3:  # pragma: no cover - IMREAD_COLOR guarantees 3
        raise ClientError("bad_image", "decoded image is not 3-channel")
    return img.astype(np.uint8, copy=False)


class OpenCvDecoder:
    name = "opencv"

    def decode(
        self, data: bytes, header: ImageHeader, min_size: tuple[int, int] | None, pool: BufferPool
    ) -> DecodedFrame:
        img = _opencv_decode(data, header, _jpeg_scale(header, min_size))
        return DecodedFrame(img, header.width, header.height, pooled=False)


class SimpleJpegDecoder:
    """libjpeg-turbo via simplejpeg: decodes straight into a pooled buffer."""

    name = "simplejpeg"

    def __init__(self) -> None:
        import simplejpeg

        self._sj = simplejpeg

    def decode(
        self, data: bytes, header: ImageHeader, min_size: tuple[int, int] | None, pool: BufferPool
    ) -> DecodedFrame:
        if header.format != "jpeg":
            return OpenCvDecoder().decode(data, header, min_size, pool)
        mw, mh = min_size or (0, 0)
        try:
            h, w, colorspace, _ = self._sj.decode_jpeg_header(
                data, min_height=mh, min_width=mw, min_factor=2
            )
        except ValueError as e:
            raise ClientError("bad_image", f"JPEG header could not be read: {e}") from None
        if colorspace not in ("YCbCr", "Gray"):  # CMYK/YCCK: let OpenCV convert
            return OpenCvDecoder().decode(data, header, min_size, pool)
        out = pool.acquire((h, w, 3))
        try:
            self._sj.decode_jpeg(
                data, colorspace="BGR", min_height=mh, min_width=mw, min_factor=2, buffer=out
            )
        except ValueError as e:
            pool.release(out)
            raise ClientError("bad_image", f"JPEG could not be decoded: {e}") from None
        return DecodedFrame(out, header.width, header.height, pooled=True)


class TurboJpegDecoder:
    """libjpeg-turbo via PyTurboJPEG (needs the system libturbojpeg)."""

    name = "turbojpeg"

    def __init__(self) -> None:
        from turbojpeg import TJPF_BGR, TurboJPEG

        self._tj = TurboJPEG()
        self._bgr = TJPF_BGR

    def decode(
        self, data: bytes, header: ImageHeader, min_size: tuple[int, int] | None, pool: BufferPool
    ) -> DecodedFrame:
        if header.format != "jpeg":
            return OpenCvDecoder().decode(data, header, min_size, pool)
        scale = _jpeg_scale(header, min_size)
        try:
            img = self._tj.decode(data, pixel_format=self._bgr, scaling_factor=(1, scale))
        except (OSError, ValueError) as e:
            raise ClientError("bad_image", f"JPEG could not be decoded: {e}") from None
        return DecodedFrame(np.asarray(img, np.uint8), header.width, header.height, pooled=False)


class PillowDecoder:
    name = "pillow"

    def decode(
        self, data: bytes, header: ImageHeader, min_size: tuple[int, int] | None, pool: BufferPool
    ) -> DecodedFrame:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as im:
                if header.format == "jpeg" and min_size is not None:
                    im.draft("RGB", min_size)  # DCT-domain scaling, never below min_size
                rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            raise ClientError("bad_image", f"image could not be decoded: {e}") from None
        return DecodedFrame(
            np.ascontiguousarray(rgb[:, :, ::-1]), header.width, header.height, pooled=False
        )


_DECODERS: dict[str, type[Decoder]] = {
    "simplejpeg": SimpleJpegDecoder,
    "turbojpeg": TurboJpegDecoder,
    "opencv": OpenCvDecoder,
    "pillow": PillowDecoder,
}


def pick_decoder(preference: str = "auto") -> Decoder:
    """The configured decoder, or with ``auto`` the fastest one that loads here."""
    if preference != "auto":
        cls = _DECODERS.get(preference)
        if cls is None:
            raise ConfigError(
                f"decode.decoder {preference!r}; allowed: auto, {', '.join(_DECODERS)}"
            )
        try:
            return cls()
        except (ImportError, OSError, RuntimeError) as e:
            raise ConfigError(f"decode.decoder {preference!r} is not usable here: {e}") from e
    for name, cls in _DECODERS.items():
        try:
            decoder = cls()
        except (ImportError, OSError, RuntimeError) as e:
            log.debug("decoder %s unavailable: %s", name, e)
            continue
        return decoder
    raise ConfigError("no image decoder is installed (need simplejpeg, opencv or pillow)")


def decode_base64(payload: bytes) -> bytes:
    """Strict base64 (RFC 4648 section 4); anything else is ``bad_base64``."""
    try:
        return b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ClientError("bad_base64", f"'image' is not valid base64: {e}") from None
