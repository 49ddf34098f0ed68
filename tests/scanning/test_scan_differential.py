"""Differential: every global CPython's C unpickler resolves, ``ptfile.scan`` lists.

Random and mutated pickles (protocols 0-5, torch's own ``data.pkl``) are run
by the C unpickler in a child process (:mod:`gate_oracle`: over a BytesIO, as
torch.load reads ZIP records; ``find_class`` records and returns an inert
stand-in; process creation blocked; memory capped), and the names it resolved
must be a subset of the globals the scan lists for the same bytes.
"""

from __future__ import annotations

import collections
import io
import json
import pickle
import pickletools
import random
import subprocess
import sys
import zipfile

import torch

import ptfile
from ptfile.scanning.verdicts import Verdict, verdict_of

_BATCH_CHILD = r"""
import io, json, pickle, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
def _block(event, args):
    if event.split(".")[0] in ("subprocess",) or event in (
            "os.system", "os.posix_spawn", "os.exec", "os.fork", "os.spawn"):
        raise RuntimeError("blocked " + event)
sys.addaudithook(_block)
out = []
for hexed in json.load(sys.stdin):
    found = []
    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            found.append([module, name])
            return lambda *a, **k: None
        def persistent_load(self, pid):
            return None
    try:
        Unpickler(io.BytesIO(bytes.fromhex(hexed))).load()
    except BaseException:
        pass
    out.append(found)
print(json.dumps(out))
"""


def _c_globals(streams: list[bytes]) -> list[set[tuple[str, str]]]:
    done = subprocess.run([sys.executable, "-I", "-c", _BATCH_CHILD],
                          input=json.dumps([s.hex() for s in streams]).encode(),
                          capture_output=True, check=True, timeout=300)
    return [{(m, n) for m, n in names} for names in json.loads(done.stdout)]


def _seeds() -> list[bytes]:
    objs: list[object] = [
        {"a": 1, "b": [1.5, "x", b"\x00\xff"], "c": (None, True)},
        collections.OrderedDict(w=[1, 2, 3]), {1, 2, 3}, frozenset({"q"}), bytearray(b"ab"),
        [collections.Counter("hello"), complex(1, 2)], list(range(300)), "t" * 300,
    ]
    seeds = [pickle.dumps(o, protocol=p) for o in objs for p in range(6)]
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2), "n": torch.nn.Linear(2, 2).state_dict()}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zf:
        seeds.append(zf.read(next(n for n in zf.namelist() if n.endswith("data.pkl"))))
    # hostile-shaped seeds: globals in every opcode form
    seeds += [b"cos\nsystem\n(S'x'\ntR.", b"\x80\x04\x8c\x02os\x8c\x06system\x93N\x85R.",
              b"(cos\nsystem\nS'x'\ni.", b"\x80\x02cbuiltins\nlist\n)\x81."]
    return seeds


_OPCODE_BYTES = sorted({ord(op.code) for op in pickletools.opcodes})


def _mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(out))
        how = rng.random()
        if how < 0.4:
            out[at] = rng.randrange(256)
        elif how < 0.7:
            out[at] = rng.choice(_OPCODE_BYTES)
        elif how < 0.85:
            del out[at]
        else:
            out[at:at] = rng.choice([b"cos\nsystem\n", b"\x93", b"(", b"R", b"\x94", b"h\x00"])
    return bytes(out)


def test_scan_lists_every_global_the_c_unpickler_resolves() -> None:
    rng = random.Random(12)
    seeds = _seeds()
    streams = seeds + [_mutate(rng, rng.choice(seeds)) for _ in range(1500)]
    misses = []
    for data, pairs in zip(streams, _c_globals(streams), strict=True):
        resolved = {f"{m}.{n}" for m, n in pairs}
        try:
            listed = {f.qualname for f in ptfile.scan(data).findings}
        except ptfile.PtfileError:
            # a damaged stream is an error (exit 2) only when all it names is allowed: the
            # C unpickler must not have resolved anything else before it failed
            listed = {f"{m}.{n}" for m, n in pairs if verdict_of(m, n) is Verdict.ALLOWED}
        if not resolved <= listed:
            misses.append((data, sorted(resolved - listed)))
    assert not misses, misses[:5]
