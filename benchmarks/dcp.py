"""Consolidating a DCP checkpoint: ``ptfile convert DIR out.pt`` against torch's ``dcp_to_torch_save``.

Usage::

    python benchmarks/dcp.py              # a 1.1 GiB checkpoint written by 4 gloo ranks
    python benchmarks/dcp.py --scale 0.1  # the same shapes, a tenth of the rows

The checkpoint is written by real torch: 4 CPU ranks (``torch.multiprocessing`` + gloo on a
FileStore) save a state dict of float32 DTensors sharded by rows (``Shard(0)``) with
``dcp.save``: one 256 MiB tensor (the largest), seven of 128 MiB, six small ones (``_SHAPES``)
and a few values.  Then each consolidator runs in a fresh child process, and the table gives its
wall time and its peak resident memory (``ru_maxrss`` of that child, from ``os.wait4``),
beside the largest tensor.  ptfile streams tensor by tensor, so its peak is about one
tensor plus its interpreter (the ``import ptfile`` row is the interpreter alone); torch holds
the whole state dict.  The two ``.pt`` files are then compared byte for byte.  Everything is
written under a temporary folder and deleted afterwards.
"""

from __future__ import annotations

import argparse
import filecmp
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
#: Full shapes (float32) at scale 1: rows scale with --scale.  1.13 GiB in all.
_SHAPES = {"embed.weight": (65536, 1024), "head.weight": (32768, 1024),
           **{f"layers.{i}.weight": (8192, 4096) for i in range(6)},
           **{f"layers.{i}.bias": (4096,) for i in range(6)}}

_WRITE = """
import sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.device_mesh import init_device_mesh

def work(rank, world, out, store, shapes):
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    sd = {"model": {}, "step": 1000, "config": {"lr": 3e-4, "name": "bench"}}
    for i, (name, shape) in enumerate(shapes.items()):
        step = -(-shape[0] // world)  # torch's Shard(0): ceil-sized pieces, the last short
        rows = [max(0, min(step, shape[0] - r * step)) for r in range(world)]
        gen = torch.Generator().manual_seed(1000 * i + rank)
        local = torch.randn((rows[rank], *shape[1:]), generator=gen)
        sd["model"][name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                               shape=torch.Size(shape),
                                               stride=torch.empty(shape, device="meta").stride())
    dcp.save(sd, checkpoint_id=out)
    dist.destroy_process_group()

if __name__ == "__main__":
    out, world, shapes = sys.argv[1], int(sys.argv[2]), eval(sys.argv[3])
    mp.spawn(work, args=(world, out, out + ".store", shapes), nprocs=world)
"""

_TORCH = """
import sys
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
dcp_to_torch_save(sys.argv[1], sys.argv[2])
"""


def _run(argv: list[str]) -> tuple[float, float]:
    """Run ``argv`` as a child; its wall seconds and peak RSS in MiB."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"{argv[:3]} failed with exit code {child.returncode}")
    return seconds, usage.ru_maxrss / 1024  # KiB on Linux


def _shapes(scale: float) -> dict[str, tuple[int, ...]]:
    return {name: (max(4, int(shape[0] * scale)), *shape[1:]) for name, shape in _SHAPES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the rows")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--keep", help="write under this folder and keep the files")
    args = parser.parse_args()
    shapes = _shapes(args.scale)
    sizes = {name: 4 * math.prod(shape) for name, shape in shapes.items()}
    largest = max(sizes.values()) / MIB
    root = Path(args.keep or tempfile.mkdtemp(prefix="ptfile-dcp-bench-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    os.environ.update(env)
    try:
        script = root / "write.py"
        script.write_text(_WRITE)
        (root / "torch").mkdir()
        (root / "ptfile").mkdir()
        ckpt = root / "ckpt"
        print(f"writing {sum(sizes.values()) / MIB:.0f} MiB with {args.ranks} gloo ranks "
              f"({len(shapes)} tensors, largest {largest:.0f} MiB) ...", flush=True)
        seconds, _ = _run([sys.executable, str(script), str(ckpt), str(args.ranks),
                           repr(shapes)])
        on_disk = sum(p.stat().st_size for p in ckpt.iterdir()) / MIB
        print(f"  {seconds:.1f} s, {on_disk:.0f} MiB in {len(list(ckpt.iterdir()))} files\n")
        rows = [("import ptfile (the interpreter)",
                 _run([sys.executable, "-c", "import ptfile.export.convert"])),
                ("ptfile convert DIR out.pt",
                 _run([sys.executable, "-m", "ptfile", "convert", str(ckpt),
                       str(root / "ptfile" / "model.pt"), "--no-progress"])),
                ("torch dcp_to_torch_save",
                 _run([sys.executable, "-c", _TORCH, str(ckpt), str(root / "torch" / "model.pt")]))]
        print(f"{'':34} {'time (s)':>9} {'peak RSS (MiB)':>15}")
        for name, (secs, rss) in rows:
            print(f"{name:34} {secs:9.2f} {rss:15.0f}")
        ptfile_rss, torch_rss = rows[1][1][1], rows[2][1][1]
        same = filecmp.cmp(root / "ptfile" / "model.pt", root / "torch" / "model.pt",
                           shallow=False)
        print(f"\nlargest tensor: {largest:.0f} MiB; ptfile peak {ptfile_rss:.0f} MiB "
              f"{'<=' if ptfile_rss <= largest + 64 else '>'} largest + 64 MiB "
              f"= {largest + 64:.0f} MiB (torch: {torch_rss:.0f} MiB)")
        print(f"ptfile's model.pt is {'byte-identical to' if same else 'DIFFERENT from'} "
              "torch's")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
