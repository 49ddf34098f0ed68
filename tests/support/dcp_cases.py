"""DCP checkpoints for the tests, written by real torch 2.13 in this process.

A multi-chunk checkpoint is made without ranks: torch writes each block of a tensor as an
item of its own file (``single_file_per_rank=False``), then the ``.metadata`` is rewritten
(with torch's own dataclasses) so that the blocks are the chunks of one tensor, which is
what several ranks would have written; torch's dcp_to_torch_save consolidates it.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorStorageMetadata,
)

ROWS, COLS = 9, 4
#: Row blocks of ``w``: one chunk (and one file) each.
BLOCKS = ((0, 3), (3, 5), (5, 9))


def make_chunked(directory: Path) -> np.ndarray:
    """A DCP directory where ``w`` (9x4 float32) has one chunk per row block, each in its
    own file, beside a plain tensor ``b`` and a value ``step``; returns ``w``'s values."""
    full = torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS)
    state: dict[str, Any] = {f"w{i}": full[a:b].clone() for i, (a, b) in enumerate(BLOCKS)}
    state.update(b=torch.ones(3, dtype=torch.bfloat16), step=7)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(directory, single_file_per_rank=False))
    meta = pickle.loads((directory / ".metadata").read_bytes())
    chunks, storage = [], {}
    props = meta.state_dict_metadata["w0"].properties
    for i, (a, b) in enumerate(BLOCKS):
        del meta.state_dict_metadata[f"w{i}"], meta.planner_data[f"w{i}"]
        info = meta.storage_data.pop(MetadataIndex(f"w{i}", torch.Size([0, 0])))
        chunks.append(ChunkStorageMetadata(torch.Size([a, 0]), torch.Size([b - a, COLS])))
        storage[MetadataIndex("w", torch.Size([a, 0]), i)] = info
    meta.state_dict_metadata["w"] = TensorStorageMetadata(props, torch.Size([ROWS, COLS]),
                                                          chunks)
    meta.planner_data["w"] = ("w",)
    meta.storage_data.update(storage)
    (directory / ".metadata").write_bytes(pickle.dumps(meta))
    return full.numpy()


def trained() -> dict[str, Any]:
    """A small model's state dict and its Adam state after one step (seeded)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optim": optimizer.state_dict()}


#: Run as a script: for each ``out world collectives`` triple of its arguments, ``world``
#: gloo ranks on loopback save DTensors (sharded unevenly, with zero-size chunks, and
#: replicated), a plain tensor and values. The ranks are forked from the one parent that
#: imported torch (spawned, each would import torch again: about 1.5 s of CPU a rank).
_RANKS = """
import sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import distribute_tensor, Shard, Replicate
from torch.distributed.device_mesh import init_device_mesh

def work(rank, world, out, store_path, collectives):
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    a = torch.arange(42.).reshape(7, 6)
    sd = {"s0": distribute_tensor(a, mesh, [Shard(0)]),
          "s1": distribute_tensor(a.t().contiguous(), mesh, [Shard(1)]),
          "z": distribute_tensor(torch.arange(2, dtype=torch.int32), mesh, [Shard(0)]),
          "rep": distribute_tensor(torch.randn(4, 5).to(torch.bfloat16), mesh, [Replicate()]),
          "plain": torch.ones(2), "meta": {"value": 3, "name": "x"}}
    dcp.save(sd, checkpoint_id=out, use_collectives=collectives)
    dist.destroy_process_group()

if __name__ == "__main__":
    for at in range(1, len(sys.argv), 3):
        out, world, collectives = sys.argv[at], int(sys.argv[at + 1]), sys.argv[at + 2] == "1"
        mp.start_processes(work, args=(world, out, out + ".store", collectives), nprocs=world,
                           start_method="fork")
"""


def save_ranks(directory: Path, world: int, collectives: bool) -> None:
    """``world`` gloo ranks save the DTensor state into ``directory``."""
    save_ranks_each([(directory, world, collectives)])


def save_ranks_each(jobs: list[tuple[Path, int, bool]]) -> None:
    """:func:`save_ranks` for each ``(directory, world, collectives)``, one after another
    under one parent process (one torch import for all of them)."""
    script = jobs[0][0].parent / "ranks.py"
    script.write_text(_RANKS)
    args = [str(a) for d, w, c in jobs for a in (d, w, "1" if c else "0")]
    subprocess.run([sys.executable, str(script), *args], check=True, capture_output=True,
                   timeout=300)
