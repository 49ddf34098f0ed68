"""picklevm.prefix.reaches_code against CPython's own unpickler: whenever the sniff says a
file's first bytes cannot reach code, the C unpickler fed them must fail (or stop on a
value other than torch's magic number) without looking a name up."""

from __future__ import annotations

import io
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from ptfile.picklevm.prefix import reaches_code

MAGIC = 0x1950A86A20F9469CFC6C
#: Opcode bytes and text: every opcode but the 8-byte-length ones (their declared lengths
#: make CPython allocate), with letters and newlines to make lines.
ALPHABET = bytes(b for b in range(256) if b not in (0x8E, 0x96, 0x8D, 0x95))


class Reached(Exception):
    pass


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if all(p.isidentifier() for p in f"{module}.{name}".split(".")):
            raise Reached
        raise ModuleNotFoundError(module)


def cpython(data: bytes) -> str:
    try:
        value = _Unpickler(io.BytesIO(data)).load()
    except Reached:
        return "code"
    except Exception:  # noqa: BLE001 - any failure is the unpickler stopping
        return "fails"
    return "magic" if type(value) is int and value == MAGIC else "value"


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=24).map(lambda b: bytes(ALPHABET[c % len(ALPHABET)] for c in b)),
       st.booleans())
def test_reaches_code_never_says_no_where_cpython_reaches_code(data: bytes,
                                                               magic: bool) -> None:
    if magic:
        data = b"I119547037146038801333356\n" + data
    if not reaches_code(data, len(data)):
        assert cpython(data) in ("fails", "value"), data


def test_text_files_do_not_read_as_pickles() -> None:
    for text in (b"# README\n", b"import os\n", b"hello world\n", b"{\"a\": 1}\n",
                 b"ctest_submit\n------------\n", b"Git v2.12.2 Release Notes\n===\n"):
        assert not reaches_code(text, len(text)), text
    payload = pickle.dumps(Reached, protocol=2)
    assert reaches_code(payload, len(payload))
    assert reaches_code(payload[:10], len(payload))  # cut short: undecided, scanned
