"""Real DeepSpeed ZeRO checkpoints for the tests, made on CPU (gloo, ``DS_ACCELERATOR=cpu``).

``python tests/support/zero_fixtures.py OUT [--world-size N] [CASE...]`` trains a tiny model for two
steps with DeepSpeed for each case and saves it under ``OUT/<case>/`` (the run folder, with
``latest`` and ``global_step2/``), then writes DeepSpeed's own consolidation beside it:
``OUT/<case>.expected.pt`` is ``torch.save`` of
``get_fp32_state_dict_from_zero_checkpoint(OUT/<case>)`` (the oracle), and
``OUT/<case>.excl.pt`` the same with ``exclude_frozen_parameters=True``, and
``OUT/<case>.cli/pytorch_model.bin`` what ``zero_to_fp32.py OUT/<case> OUT/<case>.cli`` writes.

One launch runs every case of one world size in the same processes (DeepSpeed's import
costs seconds; a case costs a fraction of one).  :func:`generate` is what the tests call.

The model holds what makes consolidation hard: a tied embedding/head, a frozen linear
layer, odd sizes (ZeRO-3 partitions and ZeRO-1/2 groups need padding), a one-element
parameter, two parameter groups (weight decay on matrices only), persistent buffers of
three dtypes and a non-persistent one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The DeepSpeed release these tests were written against (pyproject's test extra).
DEEPSPEED_VERSION = "0.19.8"


@dataclass(frozen=True)
class Case:
    """One checkpoint: ZeRO stage, training dtype, world size and extra ZeRO options."""

    stage: int
    dtype: str  # fp32, bf16, fp16
    world_size: int
    extra: tuple[tuple[str, Any], ...] = ()
    save_frozen: bool = True  # False: saved with exclude_frozen_parameters=True

    @property
    def name(self) -> str:
        extra = "".join(f"_{k}" for k, _ in self.extra)
        frozen = "" if self.save_frozen else "_exclfrozen"
        return f"z{self.stage}_{self.dtype}_ws{self.world_size}{extra}{frozen}"


#: The cases the tests generate: every stage and dtype on 1 and 2 ranks, and options.
CASES: tuple[Case, ...] = (
    *(Case(s, d, w) for w in (1, 2) for s in (1, 2, 3) for d in ("fp32", "bf16", "fp16")),
    Case(3, "fp32", 2, (("sub_group_size", 100),)),
    Case(2, "bf16", 2, (("parameter_alignment", True),)),
    Case(2, "fp32", 2, (("round_robin_gradients", True),)),
    Case(2, "fp32", 2, save_frozen=False),
    Case(3, "bf16", 2, save_frozen=False),
    # BF16_Optimizer (which DeepSpeed's zero_to_fp32 refuses): its oracle is the live model
    Case(1, "bf16", 2, (("grad_accum_fp32", True),)),
)


def is_bf16_optimizer(case: Case) -> bool:
    """Whether DeepSpeed trains ``case`` with its ``BF16_Optimizer`` (no zero_to_fp32 oracle:
    ``OUT/<case>.live.pt`` holds the live model's bf16 parameters instead)."""
    return dict(case.extra).get("grad_accum_fp32", False)


def _model() -> Any:
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))  # one element, a root parameter
            self.embed = nn.Embedding(37, 12)
            self.lin1 = nn.Linear(12, 19)
            self.norm = nn.LayerNorm(19)
            self.frozen = nn.Linear(19, 19, bias=False)
            self.frozen.weight.requires_grad_(False)
            self.lin2 = nn.Linear(19, 12)
            self.head = nn.Linear(12, 37, bias=False)
            self.head.weight = self.embed.weight  # tied
            self.register_buffer("ema", torch.linspace(0, 1, 7))
            self.register_buffer("counter", torch.arange(3, dtype=torch.int64))
            self.register_buffer("mask", torch.tensor([True, False, True]))
            self.register_buffer("scratch", torch.zeros(4), persistent=False)

        def forward(self, x: Any) -> Any:
            h = self.norm(torch.relu(self.lin1(self.embed(x))))
            h = self.frozen(h) + h
            return self.head(self.lin2(h) * self.scale)

    return Tiny()


def _config(case: Case) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": case.stage,
                            **{k: v for k, v in case.extra if k != "grad_accum_fp32"}}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "torch_adam": True}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }
    if case.dtype == "bf16":
        config["bf16"] = {"enabled": True}
    if is_bf16_optimizer(case):
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    elif case.dtype == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": 4}
    return config


def _train_and_save(case: Case, out: Path) -> None:
    import deepspeed
    import torch

    torch.manual_seed(0)
    model = _model()
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() <= 1]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=_config(case))
    rank = torch.distributed.get_rank()
    gen = torch.Generator().manual_seed(rank)
    for _ in range(2):
        x = torch.randint(0, 37, (2, 5), generator=gen)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(str(out / case.name),
                           exclude_frozen_parameters=not case.save_frozen)
    if is_bf16_optimizer(case) and rank == 0:
        torch.save({n: p.detach().clone() for n, p in engine.module.named_parameters()},
                   str(out / (case.name + ".live.pt")))
    torch.distributed.barrier()
    engine.destroy()


def _expected(case: Case, out: Path) -> None:
    import torch
    from deepspeed.utils.zero_to_fp32 import (
        convert_zero_checkpoint_to_fp32_state_dict,
        get_fp32_state_dict_from_zero_checkpoint,
    )

    folder = str(out / case.name)
    for suffix, exclude in ((".expected.pt", False), (".excl.pt", True)):
        state = get_fp32_state_dict_from_zero_checkpoint(folder, exclude_frozen_parameters=exclude)
        torch.save(state, str(out / (case.name + suffix)))
    # what zero_to_fp32.py DIR OUT writes: OUT/pytorch_model.bin
    convert_zero_checkpoint_to_fp32_state_dict(folder, str(out / (case.name + ".cli")))


def _no_shm_op() -> None:
    """Skip DeepSpeed's shared-memory all-reduce op: ``init_distributed`` compiles it with
    ninja on CPU (about 25 s of both cores in each new environment), and only
    ``inference_all_reduce`` uses it; training reduces through the gloo process group."""
    import importlib

    # by module name: ``deepspeed.comm.torch`` as an attribute is the torch package
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def _worker(out: str, names: list[str]) -> None:
    """Run in each rank's process: every case named, in turn."""
    import logging

    import deepspeed
    import torch

    deepspeed.utils.logger.setLevel(logging.ERROR)
    _no_shm_op()
    deepspeed.init_distributed(dist_backend="gloo")
    for case in (c for c in CASES if c.name in names):
        _train_and_save(case, Path(out))
        if torch.distributed.get_rank() == 0 and not is_bf16_optimizer(case):
            _expected(case, Path(out))
        torch.distributed.barrier()


def _launch(out: Path, world_size: int, names: list[str], port: int) -> None:
    procs, logs = [], []
    for rank in range(world_size):
        env = dict(os.environ, DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
                   OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        # A file, not a pipe: a rank blocked on a full pipe would stall the others.
        log = tempfile.TemporaryFile()  # noqa: SIM115 (closed below, once the rank ends)
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--worker", str(out), *names], env=env,
            stdout=log, stderr=subprocess.STDOUT))
    for p, log in zip(procs, logs):
        p.wait(timeout=600)
        log.seek(0)
        text = log.read()
        log.close()
        if p.returncode:
            raise RuntimeError(f"DeepSpeed rank failed ({p.returncode}):\n"
                               + text.decode(errors="replace")[-4000:])


def _free_port() -> int:
    """A loopback port free now (runs in parallel, pytest-xdist's workers, each take one)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def generate(out: Path, cases: tuple[Case, ...] = CASES, port: int | None = None) -> Path:
    """Make ``cases`` under ``out`` (one launch per world size, each on a free loopback port
    unless ``port`` is given); return ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    sizes = sorted({c.world_size for c in cases})
    for i, ws in enumerate(sizes):
        _launch(out, ws, [c.name for c in cases if c.world_size == ws],
                _free_port() if port is None else port + i)
    return out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--worker":
        _worker(args[1], args[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    ns = parser.parse_args(args)
    chosen = tuple(c for c in CASES if not ns.cases or c.name in ns.cases)
    generate(ns.out, chosen)
    for case in chosen:
        print(case.name)


if __name__ == "__main__":
    main()
