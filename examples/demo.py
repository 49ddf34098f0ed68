"""The README's `make demo`: write a checkpoint from numpy, inspect it, load it back.

Runs without torch.  It writes `examples/out/demo.pt`, prints what is inside, loads it
back with and without mmap, checks the values, and loads a checkpoint written by torch
2.13 that ships with the tests (`tests/golden/tiny_state_dict.pt`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

import ptfile

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"


def describe(obj: object, indent: str = "") -> None:
    """Print a loaded object tree: tensors as dtype/shape/stride/storage lines."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)  # type: ignore[arg-type]
    for key, value in items:
        if isinstance(value, ptfile.Tensor):
            storage = value.storage
            print(f"{indent}{key}: {value.dtype} {list(value.shape)} stride={value.stride()} "
                  f"offset={value.storage_offset()} storage={storage.key if storage else None}")
        elif isinstance(value, (dict, list, tuple)):
            print(f"{indent}{key}:")
            describe(value, indent + "  ")
        else:
            print(f"{indent}{key}: {value!r}")


def main() -> int:
    OUT.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 3)).astype(np.float32)
    state = {
        "encoder.weight": weight,
        "encoder.weight_t": weight.T,                     # a view: shares the storage
        "encoder.bias": np.zeros(4, np.float32),
        "embed.bf16": rng.standard_normal((2, 5)).astype(ml_dtypes.bfloat16),
        "step": 1000,
        "name": "demo",
    }
    path = OUT / "demo.pt"
    ptfile.save(state, path)
    print(f"wrote {path.relative_to(HERE.parent)} ({os.path.getsize(path)} bytes)")

    loaded = ptfile.load(path)
    describe(loaded)
    assert loaded["encoder.weight"].storage is loaded["encoder.weight_t"].storage
    assert np.array_equal(np.asarray(loaded["encoder.weight_t"]), weight.T)

    mapped = ptfile.load(path, mmap=True)
    assert np.array_equal(mapped["embed.bf16"].numpy(), state["embed.bf16"])
    print("mmap load: values equal, storages are views of the file")

    golden = HERE.parent / "tests" / "golden" / "tiny_state_dict.pt"
    sd = ptfile.load(golden)
    print(f"\n{golden.name} (written by torch 2.13):")
    describe(sd, "  ")
    print(f"  _metadata: {dict(sd._metadata)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
