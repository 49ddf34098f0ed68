"""Payloads nested in a pickle's constants: what a byte string or a text literal may hide.

A pickle can carry another pickle (or a ZIP archive) as data, for a later
``pickle.loads`` / ``torch.load`` / ``torch.storage._load_from_bytes`` to run:

* raw, in a byte string (``BINBYTES``, ``SHORT_BINBYTES``, ``BYTEARRAY8``) or a
  latin-1 text (``_codecs.encode(text, "latin1")``, how picklers write bytes);
* as base64 text (``pickle.loads(base64.b64decode("gASV..."))``) or hex text
  (``bytes.fromhex("8004...")``), in a text or a byte string.

:func:`nested_payload` says which one a constant is, cheaply: only constants
of at least :data:`MIN_ENCODED_CHARS` characters are decoded, only when every
character is of the base64 (standard or URL-safe) or hex alphabet, and only
after the first few decoded bytes look like a pickle or a ZIP
(:func:`looks_like_payload`).  The scanner then scans what it returns
(:mod:`ptfile.scanning.stream`), and reports it only when it reads as one:
random bytes that happen to start with a pickle opcode are no finding.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Final

__all__ = ["MIN_ENCODED_CHARS", "ends_look_like_payload", "looks_like_payload", "may_be_encoded", "may_hold_payload",
           "nested_payload", "starts_in_alphabet"]

#: Encoded constants shorter than this are not decoded: the shortest pickle that imports
#: and calls (``cos\nsystem\n(S'x'\ntR.``, 20 bytes) is 28 base64 characters, 40 hex.
MIN_ENCODED_CHARS: Final = 24
#: Characters decoded to decide whether a constant may be an encoded payload.
_HEAD_CHARS: Final = 32
#: Protocol 0/1 opcodes a pickle that imports something starts with, in practice:
#: GLOBAL, MARK, INST, and pushes that are popped before the call.
_OPENERS: Final = frozenset(b"c(iSVIN]}")
_BASE64: Final = re.compile(rb"[A-Za-z0-9+/\-_\r\n]+={0,2}\s*")
_HEX: Final = re.compile(rb"[0-9a-fA-F\s]+")
_WHITESPACE: Final = re.compile(rb"\s+")
#: Sixteen characters of base64 or hex text (the gate before any decoding), as text and bytes.
_ALPHABET_HEAD: Final = re.compile(r"[A-Za-z0-9+/\-_\s]{16}")
_ALPHABET_HEAD_BYTES: Final = re.compile(rb"[A-Za-z0-9+/\-_\s]{16}")


def starts_in_alphabet(text: str | bytes | bytearray) -> bool:
    """Whether the first characters of a constant are all of the base64 or hex alphabet:
    one regex match, the gate before :func:`may_be_encoded` decodes anything."""
    if isinstance(text, str):
        return _ALPHABET_HEAD.match(text) is not None
    return _ALPHABET_HEAD_BYTES.match(text) is not None


def _starts_like_payload(head: bytes) -> bool:
    """Whether decoded bytes start like a pickle or a ZIP: ``PROTO`` 1-5, a ZIP local
    header, or protocol 0/1 text (an opener, a newline, ASCII: ``cos\\nsystem\\n``,
    ``(dp0\\n``).  Stricter than :func:`looks_like_payload`, as decoding text that merely
    uses the alphabet (names without dots) gives random bytes."""
    return (len(head) >= 2 and head[0] == 0x80 and 1 <= head[1] <= 5) \
        or head.startswith(b"PK\x03\x04") \
        or (head[:1] != b"" and head[0] in _OPENERS and b"\n" in head and head.isascii())


def looks_like_payload(blob: bytes | bytearray | memoryview) -> bool:
    """Whether bytes may be a pickle or a ZIP: they start with ``PROTO`` 1-5 or a ZIP local
    header, or with a protocol 0/1 opener and end with ``STOP`` (``.``).

    Examples
    --------
    >>> looks_like_payload(b"\\x80\\x04\\x95"), looks_like_payload(b"PK\\x03\\x04")
    (True, True)
    >>> looks_like_payload(b"cos\\nsystem\\n(S'id'\\ntR."), looks_like_payload(b"conv1.weight")
    (True, False)
    """
    return ends_look_like_payload(bytes(blob[:4]), bytes(blob[-8:]))


def ends_look_like_payload(head: bytes, tail: bytes) -> bool:
    """:func:`looks_like_payload` from the first 4 and the last 8 bytes alone."""
    if (len(head) >= 2 and head[0] == 0x80 and 1 <= head[1] <= 5) \
            or head.startswith(b"PK\x03\x04"):
        return True
    return head[:1] != b"" and head[0] in _OPENERS and tail.rstrip().endswith(b".")


def may_hold_payload(text: str | bytes | bytearray) -> bool:
    """:func:`looks_like_payload` or :func:`may_be_encoded`, for a text or byte string
    (a text as its latin-1 encoding, as picklers write bytes)."""
    if isinstance(text, str):
        ends = (text[:4].encode("latin-1", "replace"), text[-8:].encode("latin-1", "replace"))
    else:
        ends = (bytes(text[:4]), bytes(text[-8:]))
    return ends_look_like_payload(*ends) or may_be_encoded(text)


def _as_bytes(text: str | bytes | bytearray | memoryview) -> bytes | None:
    if isinstance(text, str):
        return text.encode("ascii") if text.isascii() else None
    return bytes(text)


def _decode(kind: str, raw: bytes, head: bool = False) -> bytes | None:
    """Decode ``raw`` (whitespace ignored); a ``head`` is cut to whole units first."""
    raw = _WHITESPACE.sub(b"", raw)
    if head:
        raw = raw[:len(raw) & ~1] if kind == "hex" else raw[:len(raw) & ~3]
    try:
        if kind == "hex":
            return bytes.fromhex(raw.decode("ascii")) if len(raw) % 2 == 0 else None
        alt = b"-_" if b"-" in raw or b"_" in raw else None
        return base64.b64decode(raw + b"=" * (-len(raw) % 4), altchars=alt, validate=True)
    except (ValueError, binascii.Error):
        return None


def _kind(raw: bytes) -> str | None:
    if _HEX.fullmatch(raw):
        return "hex"
    if _BASE64.fullmatch(raw):
        return "base64"
    return None


def may_be_encoded(text: str | bytes | bytearray | memoryview) -> bool:
    """Whether a constant may be base64 or hex text of a payload (decodes only its head).

    Examples
    --------
    >>> import base64, pickle
    >>> may_be_encoded(base64.b64encode(pickle.dumps([1, 2, 3] * 4)))
    True
    >>> may_be_encoded("model.layers.10.self_attn.q_proj.weight")
    False
    """
    if len(text) < MIN_ENCODED_CHARS:
        return False
    raw = _as_bytes(text[:_HEAD_CHARS])
    kind = None if raw is None else _kind(raw)
    if raw is None or kind is None:
        return False
    head = _decode(kind, raw, head=True)
    return head is not None and _starts_like_payload(head)


def nested_payload(text: str | bytes | bytearray | memoryview,
                   limit: int) -> tuple[str, bytes] | None:
    """``(encoding, decoded bytes)`` when a constant is base64 or hex text of what looks
    like a pickle or a ZIP, at most ``limit`` decoded bytes; otherwise None.

    Examples
    --------
    >>> nested_payload(b"80 02 63 6f 73 0a 2e", 1 << 20) is None  # under MIN_ENCODED_CHARS
    True
    >>> nested_payload("80026370" * 8, 1 << 20)[0]
    'hex'
    """
    if len(text) < MIN_ENCODED_CHARS or len(text) > 2 * limit or not may_be_encoded(text):
        return None
    raw = _as_bytes(text)
    kind = None if raw is None else _kind(raw)
    if raw is None or kind is None:
        return None
    decoded = _decode(kind, raw)
    if decoded is None or not _starts_like_payload(decoded):
        return None
    return kind, decoded
