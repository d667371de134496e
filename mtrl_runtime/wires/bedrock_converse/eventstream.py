"""AWS event-stream framing (``application/vnd.amazon.eventstream``), as botocore's ``eventstream`` parser reads it.

One message is, big-endian::

    total_length u32 | headers_length u32 | prelude_crc u32     (the prelude: crc32 of its first 8 bytes)
    headers: name_len u8, name, type u8 (7 = string), value_len u16, value   (repeated)
    payload
    message_crc u32                                             (crc32 of everything before it)

Bedrock's stream events carry three string headers: ``:event-type`` (the
member of the stream union, e.g. ``contentBlockDelta``), ``:content-type``
(``application/json``) and ``:message-type`` (``event``). A failure after the
stream began is an ``exception`` message: ``:exception-type`` names one of the
union's exception members (e.g. ``modelStreamErrorException``) and the JSON
payload holds its ``message``; botocore raises it as ``EventStreamError``.
"""

from __future__ import annotations

import functools
import struct
from binascii import crc32

CONTENT_TYPE = b"application/vnd.amazon.eventstream"
_STRING = 7
_PRELUDE = struct.Struct(">II")
_CRC = struct.Struct(">I")


def encode_headers(headers: list[tuple[str, str]]) -> bytes:
    """String-valued headers in the wire's order."""
    out = bytearray()
    for name, value in headers:
        raw_name, raw_value = name.encode(), value.encode()
        if len(raw_name) > 255 or len(raw_value) > 65535:
            raise ValueError(f"event-stream header {name!r} is too long")
        out += bytes((len(raw_name),)) + raw_name + bytes((_STRING,)) + len(raw_value).to_bytes(2, "big") + raw_value
    return bytes(out)


def encode_message(headers: bytes, payload: bytes) -> bytes:
    """One framed message from encoded ``headers`` and ``payload``, both checksums included."""
    prelude = _PRELUDE.pack(12 + len(headers) + len(payload) + 4, len(headers))
    prelude += _CRC.pack(crc32(prelude))
    body = prelude + headers + payload
    return body + _CRC.pack(crc32(body))


@functools.lru_cache(maxsize=64)
def event_headers(event_type: str) -> bytes:
    """The encoded headers of a JSON ``event`` of ``event_type`` (a few types, so cached)."""
    return encode_headers(
        [(":event-type", event_type), (":content-type", "application/json"), (":message-type", "event")]
    )


def event(event_type: str, payload: bytes) -> bytes:
    """A JSON event of the stream, framed."""
    return encode_message(event_headers(event_type), payload)


def exception(exception_type: str, payload: bytes) -> bytes:
    """An exception message of the stream (``exception_type``: the union's member), framed."""
    headers = encode_headers(
        [(":exception-type", exception_type), (":content-type", "application/json"), (":message-type", "exception")]
    )
    return encode_message(headers, payload)


__all__ = ["CONTENT_TYPE", "encode_headers", "encode_message", "event", "event_headers", "exception"]
