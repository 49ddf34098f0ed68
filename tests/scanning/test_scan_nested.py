"""Nested payloads: pickles and archives hidden in constants, as text, or after STOP.

Each generator below hides a pickle that calls ``os.system`` (never run: the
scanner only reads) in a benign-looking checkpoint: raw in a byte string, as
base64 or hex text, as a whole ``torch.save`` archive, after the record's
``STOP``.  Each has a benign twin (the same container around a harmless
pickle, or around bytes that merely look alike) that torch loads with
``weights_only=True`` and that must scan clean.
"""

from __future__ import annotations

import base64
import io
import os
import pickle
import random
from collections.abc import Callable

import pytest
import torch

import ptfile
from gate_oracle import c_unpickler
from hostile import checkpoint
from ptfile import cli, outcomes
from ptfile.scanning import Verdict
from ptfile.scanning.nested import MIN_ENCODED_CHARS, may_be_encoded, nested_payload


class _Payload:
    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, ("echo pwned",))


EVIL = {p: pickle.dumps(_Payload(), protocol=p) for p in range(6)}
#: A benign nested pickle: what a checkpoint may legitimately carry as bytes.
KIND = pickle.dumps({"lr": 0.1, "steps": [1, 2, 3]}, protocol=2)


def padded(inner: bytes) -> bytes:
    """``inner`` made over 255 bytes long: a 300-character text pushed and popped (after
    PROTO, outside any frame; before STOP in a protocol 0 pickle)."""
    pad = b"X" + (300).to_bytes(4, "little") + b"x" * 300 + b"0"
    if inner.startswith(b"\x80"):
        return inner[:2] + pad + inner[2:]
    return inner[:-1] + pad + b"."


def _zip_of(inner: bytes) -> bytes:
    return checkpoint(inner)


def holder(value: object, protocol: int = 2) -> bytes:
    """A torch.save archive of ``{"w": tensor, "blob": value}``."""
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2), "blob": value}, buf, pickle_protocol=protocol)
    return buf.getvalue()


#: technique -> (make a file around an inner pickle)
TECHNIQUES: dict[str, Callable[[bytes], bytes]] = {
    "binbytes": lambda p: holder(padded(p), protocol=3),  # BINBYTES (over 255 bytes)
    "short_binbytes": lambda p: holder(p, protocol=3),
    "bytearray8": lambda p: holder(bytearray(p), protocol=5),
    "latin1_text": lambda p: holder(p, protocol=2),  # _codecs.encode(text, "latin1")
    "base64_text": lambda p: holder(base64.b64encode(p).decode()),
    "base64_bytes": lambda p: holder(base64.b64encode(p), protocol=3),
    "urlsafe_base64": lambda p: holder(base64.urlsafe_b64encode(p).decode()),
    "base64_lines": lambda p: holder(base64.encodebytes(padded(p)).decode()),
    "hex_text": lambda p: holder(p.hex()),
    "hex_spaced": lambda p: holder(p.hex(" ")),
    "zip_in_bytes": lambda p: holder(_zip_of(p), protocol=3),
    "base64_zip": lambda p: holder(base64.b64encode(_zip_of(p)).decode()),
    "nested_twice": lambda p: holder(base64.b64encode(pickle.dumps({"x": p}, 3)).decode()),
    "second_pickle": lambda p: checkpoint(pickle.dumps({"w": 1}, 2) + p),
    "after_stop_junk": lambda p: checkpoint(pickle.dumps({"w": 1}, 2) + b"\0junk" + p),
    "bare_second_pickle": lambda p: pickle.dumps([1, 2], 2) + p,
}


@pytest.mark.parametrize("protocol", [0, 2, 4])
@pytest.mark.parametrize("technique", sorted(TECHNIQUES))
def test_scan_finds_a_nested_payload_and_calls_the_file_dangerous(technique: str,
                                                                  protocol: int) -> None:
    data = TECHNIQUES[technique](EVIL[protocol])
    result = ptfile.scan(data)
    assert result.is_dangerous, [f for f in result.findings if f.verdict is not Verdict.ALLOWED]
    found = [f for f in result.findings if f.qualname in {"posix.system", "os.system"}]
    assert found and all(f.verdict is Verdict.DANGEROUS for f in found)
    # The path says where the payload hides: the record, then the constant or STOP.
    assert all(">" in f.location or "after STOP" in f.location for f in found), found


@pytest.mark.parametrize("technique", sorted(TECHNIQUES))
def test_a_benign_nested_pickle_scans_as_its_contents(technique: str) -> None:
    data = TECHNIQUES[technique](KIND)
    result = ptfile.scan(data)
    assert not result.is_dangerous, [f for f in result.findings if f.verdict is not
                                      Verdict.ALLOWED]
    if technique in {"second_pickle", "after_stop_junk", "bare_second_pickle"}:
        return  # bytes after STOP: unknown (torch ignores them, other tools may not)
    assert result.is_clean, [f for f in result.findings if f.verdict is not Verdict.ALLOWED]
    assert any(f.kind == "nested" for f in result.findings)
    if technique in WEIGHTS_ONLY:
        assert torch.load(io.BytesIO(data), weights_only=True)["blob"] is not None


#: Techniques whose files torch loads with weights_only=True (protocol 2: its weights-only
#: unpickler has neither BINBYTES nor FRAME).
WEIGHTS_ONLY: frozenset[str] = frozenset({"latin1_text", "base64_text", "urlsafe_base64",
                                          "base64_lines", "hex_text", "hex_spaced",
                                          "base64_zip", "nested_twice"})


def test_the_encoded_payload_is_what_cpython_would_run() -> None:
    # The decoded constant is the pickle itself: fed to pickle.loads it calls os.system.
    text = base64.b64encode(EVIL[4]).decode()
    found = nested_payload(text, 1 << 20)
    assert found is not None and found[0] == "base64"
    assert c_unpickler(found[1])["calls"] in ([["posix", "system"]], [["os", "system"]])


def test_loads_of_b64decode_is_dangerous_on_both_counts() -> None:
    # pickle.loads(base64.b64decode("...")): the loader call and the payload it decodes.
    text = base64.b64encode(EVIL[2])
    data = (b"\x80\x02cpickle\nloads\ncbase64\nb64decode\nC" + bytes([len(text)]) + text
            + b"\x85R\x85R.")
    result = ptfile.scan(data)
    dangerous = {f.qualname for f in result.findings if f.verdict is Verdict.DANGEROUS}
    assert "pickle.loads" in dangerous
    assert dangerous & {"posix.system", "os.system"}


def test_nesting_beyond_the_bound_is_dangerous_and_stops() -> None:
    inner = KIND
    for _ in range(8):
        inner = pickle.dumps({"x": base64.b64encode(inner).decode()}, 2)
    result = ptfile.scan(inner)
    assert result.is_dangerous
    assert any(f.kind == "nested" and "nested more than" in f.message for f in result.findings)


def test_cli_exit_codes_for_nested_payloads(tmp_path: object) -> None:
    from pathlib import Path

    folder = Path(str(tmp_path))
    evil, kind = folder / "evil.pt", folder / "kind.pt"
    evil.write_bytes(TECHNIQUES["hex_text"](EVIL[2]))
    kind.write_bytes(TECHNIQUES["hex_text"](KIND))
    assert cli.main(["scan", str(evil)]) == outcomes.EXIT_UNSAFE
    assert cli.main(["scan", str(kind)]) == outcomes.EXIT_OK


# --------------------------------------------------------------------------- false positives

rng = random.Random(12)
#: Constants that look like payloads at first sight and are none.
LOOKALIKES: dict[str, object] = {
    "random_bytes": bytes(rng.randrange(256) for _ in range(4096)),
    "proto_head_garbage": b"\x80\x02" + bytes(rng.randrange(256) for _ in range(500)),
    "pk_head_garbage": b"PK\x03\x04" + bytes(rng.randrange(256) for _ in range(500)),
    "base64_of_random": base64.b64encode(bytes(rng.randrange(256) for _ in range(300))).decode(),
    "sha256_hex": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "hex_that_starts_8002": "8002" + "ff" * 40,
    "long_key": "model.layers.10.self_attn.q_proj.weight",
    "alphabet_key": "encoderlayer0attentionqueryweight",
    "text_ending_in_stop": "c'est la vie, and that is that.",
}


@pytest.mark.parametrize("name", sorted(LOOKALIKES))
@pytest.mark.parametrize("protocol", [2, 3, 5])
def test_constants_that_only_look_like_payloads_stay_clean(name: str, protocol: int) -> None:
    data = holder(LOOKALIKES[name], protocol)
    if protocol == 2:  # torch's weights-only unpickler has neither BINBYTES nor FRAME
        torch.load(io.BytesIO(data), weights_only=True)
    result = ptfile.scan(data)
    assert result.is_clean, [f for f in result.findings if f.verdict is not Verdict.ALLOWED]
    assert not any(f.kind == "nested" for f in result.findings)


def test_tensor_bytes_after_the_pickles_are_not_scanned_as_payloads() -> None:
    # Legacy streams keep raw storages after their pickles: tensor bytes that start
    # with PROTO or hold base64-looking runs are data, not nested pickles.
    values = torch.frombuffer(bytearray(b"\x80\x02" + EVIL[2] * 3 + b"QUJD" * 64),
                              dtype=torch.uint8).clone()
    buf = io.BytesIO()
    torch.save({"t": values}, buf, _use_new_zipfile_serialization=False)
    assert ptfile.scan(buf.getvalue()).is_clean
    buf = io.BytesIO()
    torch.save({"t": values}, buf)
    assert ptfile.scan(buf.getvalue()).is_clean


def test_the_encoded_check_is_cheap_and_bounded() -> None:
    assert not may_be_encoded("A" * (MIN_ENCODED_CHARS - 1))
    assert nested_payload("gAJ" + "A" * 40, 10) is None  # longer than twice the limit
    assert nested_payload("not base64 at all, but long enough to be", 1 << 20) is None


def test_many_heads_after_stop_stay_bounded() -> None:
    # Every PROTO after STOP is a probe; each reads one tiny pickle and none recurses into
    # the rest, so a record of 200,000 of them costs Limits.max_trailing_probes probes, not more.
    import time

    data = checkpoint(pickle.dumps({"w": 1}, 2) + b"\0" + b"\x80\x02N." * 200_000)
    start = time.perf_counter()
    result = ptfile.scan(data)
    assert time.perf_counter() - start < 10
    assert not result.is_dangerous


def test_more_nested_pickles_than_the_budget_leave_the_rest_unknown() -> None:
    most = ptfile.DEFAULT_LIMITS.max_nested_scans
    blobs = [b"\x80\x02K%c." % (i % 256) for i in range(most + 10)]
    result = ptfile.scan(pickle.dumps(blobs, 3))
    limits = [f for f in result.findings if f.kind == "limit" and f.name == "nested-scans"]
    assert len(limits) == 1 and result.verdict is Verdict.UNKNOWN


def test_many_names_in_the_alphabet_stay_on_the_fast_path_and_clean() -> None:
    # Names without dots use the base64 alphabet; decoded, they are random bytes, which
    # must neither count as payloads nor exhaust the nested-scan budget.
    from ptfile.scanning.nested import may_hold_payload

    names = [f"encoderlayer{i}attentionqueryweight" for i in range(20_000)]
    assert not any(may_hold_payload(n) for n in names)
    result = ptfile.scan(pickle.dumps(dict.fromkeys(names, 1.0), 2))
    assert result.is_clean, [f for f in result.findings if f.verdict is not Verdict.ALLOWED]
