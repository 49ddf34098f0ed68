"""Consolidating a DeepSpeed ZeRO checkpoint: ``ptfile convert DIR out.pt`` against DeepSpeed's ``zero_to_fp32``.

Usage::

    python benchmarks/zero.py              # 69 M parameters (276 MB fp32), 2 ranks, ZeRO 2 and 3
    python benchmarks/zero.py --scale 0.2  # the same layers, a fifth of the width

For each stage, real DeepSpeed (``DS_ACCELERATOR=cpu``, 2 gloo ranks) trains a bf16 model
one step and saves it: a 5003 x 2047 embedding tied to the head (the largest tensor) and 14
square linear layers.  Then each consolidator runs in a fresh child process and the table
gives its wall time and peak resident memory (``ru_maxrss`` of that child, from
``os.wait4``): ptfile's convert, DeepSpeed's script (its CLI: one ``pytorch_model.bin``),
its ``get_fp32_state_dict_from_zero_checkpoint`` in lazy mode with each tensor made
contiguous in turn, and the import of torch and DeepSpeed alone (the floor of both of
DeepSpeed's rows).  ptfile's output is then loaded with torch and compared with the
script's, name by name, and byte for byte.  Everything is written under a temporary folder and deleted.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIB = 1 << 20

_WRITE = """
import sys, logging, torch, deepspeed
from torch import nn
out, stage, width, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
deepspeed.utils.logger.setLevel(logging.ERROR)
import importlib  # skip the shared-memory all-reduce op's compile: only inference uses it
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo")

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5003, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.head = nn.Linear(width, 5003, bias=False)
        self.head.weight = self.embed.weight
    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = torch.relu(layer(h))
        return self.head(h)

torch.manual_seed(0)
config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
          "zero_optimization": {"stage": stage}, "steps_per_print": 10**9}
model = Model()
engine, *_ = deepspeed.initialize(model=model, config=config,
                                  model_parameters=model.parameters())
x = torch.randint(0, 5003, (1, 4))
loss = engine(x).float().mean()
engine.backward(loss)
engine.step()
engine.save_checkpoint(out)
"""

_LAZY = """
import sys
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
sd = get_fp32_state_dict_from_zero_checkpoint(sys.argv[1], lazy_mode=True)
for name in list(sd):
    sd[name].contiguous()
"""

_SAME = """
import sys, torch
a = torch.load(sys.argv[1], weights_only=True)
b = torch.load(sys.argv[2], weights_only=True)
same = list(a) == list(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
print("equal" if same else "DIFFERENT")
"""


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run ``argv`` as a child; its wall seconds and peak RSS in MiB."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=env)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{argv[:4]} failed with exit code {os.waitstatus_to_exitcode(status)}")
    return seconds, usage.ru_maxrss / 1024  # KiB on Linux


def _write(root: Path, stage: int, width: int, layers: int) -> Path:
    """A ZeRO-``stage`` checkpoint saved by 2 DeepSpeed ranks."""
    script = root / "write.py"
    script.write_text(_WRITE)
    ckpt = root / f"zero{stage}"
    procs = []
    for rank in range(2):
        env = dict(os.environ, DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(29650 + stage), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), str(ckpt), str(stage),
                                       str(width), str(layers)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for p in procs:
        if p.wait():
            raise SystemExit(f"DeepSpeed rank failed ({p.returncode})")
    return ckpt


def _bench(root: Path, ckpt: Path, env: dict[str, str]) -> None:
    tag = (ckpt / "latest").read_text().strip()
    files = list((ckpt / tag).iterdir())
    print(f"{ckpt.name}: {sum(f.stat().st_size for f in files) / MIB:.0f} MiB in "
          f"{len(files)} files")
    out_pt, out_ds = root / f"{ckpt.name}-ptfile.pt", root / f"{ckpt.name}-ds"
    ds_env = {**env, "DS_ACCELERATOR": "cpu"}
    rows = [
        ("import ptfile (the interpreter)",
         _run([sys.executable, "-c", "import ptfile.export.convert"], env)),
        ("ptfile convert DIR out.pt",
         _run([sys.executable, "-m", "ptfile", "convert", str(ckpt), str(out_pt),
               "--no-progress"], env)),
        ("zero_to_fp32.py DIR out/ (CLI)",
         _run([sys.executable, str(ckpt / "zero_to_fp32.py"), str(ckpt), str(out_ds)], ds_env)),
        ("get_fp32_state_dict(lazy_mode=True)",
         _run([sys.executable, "-c", _LAZY, str(ckpt)], ds_env)),
        ("import torch, deepspeed (the floor)",
         _run([sys.executable, "-c", "import torch, deepspeed.utils.zero_to_fp32"], ds_env)),
    ]
    print(f"  {'':38} {'time (s)':>9} {'peak RSS (MiB)':>15}")
    for name, (secs, rss) in rows:
        print(f"  {name:38} {secs:9.2f} {rss:15.0f}")
    ours, cli = rows[1][1], rows[2][1]
    print(f"  ptfile / zero_to_fp32 CLI: {ours[0] / cli[0]:.2f} x the time, "
          f"{ours[1] / cli[1]:.2f} x the peak RSS")
    same = subprocess.run([sys.executable, "-c", _SAME, str(out_pt),
                           str(out_ds / "pytorch_model.bin")], capture_output=True, text=True,
                          env=env, check=True).stdout.strip()
    identical = filecmp.cmp(out_pt, out_ds / "pytorch_model.bin", shallow=False)
    print(f"  ptfile's out.pt and the script's pytorch_model.bin: {same} in torch, "
          f"{'byte-identical' if identical else 'different bytes'}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the width")
    parser.add_argument("--layers", type=int, default=14)
    parser.add_argument("--keep", help="write under this folder and keep the files")
    args = parser.parse_args()
    width = max(8, int(2047 * args.scale))
    params = 5003 * width + args.layers * (width * width + width)
    root = Path(args.keep or tempfile.mkdtemp(prefix="ptfile-zero-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    print(f"{params / 1e6:.1f} M parameters ({4 * params / 1e6:.0f} MB fp32, largest tensor "
          f"{5003 * width * 4 / MIB:.0f} MiB), bf16 training, 2 ranks\n", flush=True)
    try:
        for stage in (2, 3):
            _bench(root, _write(root, stage, width, args.layers), env)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
