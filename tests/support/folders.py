"""Checkpoint folders as the real libraries write them, for the folder tests.

* ``st_one``, ``st_sharded``: ``transformers``' ``save_pretrained`` of a tiny Llama with
  tied embeddings (safetensors: the tied ``lm_head.weight`` left out, as transformers does).
* ``bin_one``, ``bin_sharded``: the ``.bin`` layout transformers 4 wrote
  (``pytorch_model.bin``, or ``pytorch_model-0000k-of-0000n.bin`` shards and
  ``pytorch_model.bin.index.json``), written here with ``torch.save`` because transformers
  5 writes safetensors only: every name kept, tied tensors in one shard sharing a storage,
  as ``huggingface_hub``'s shard split groups them.
* ``trainer``: a real ``transformers.Trainer`` run of two steps, its ``checkpoint-2/``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def make_zoo(root: Path) -> dict[str, Path]:
    """Write every folder under ``root``; return them by name."""
    import torch
    from torch.utils.data import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    out = {"st_one": root / "st_one", "st_sharded": root / "st_sharded",
           "bin_one": root / "bin_one", "bin_sharded": root / "bin_sharded"}
    model.save_pretrained(out["st_one"])
    model.save_pretrained(out["st_sharded"], max_shard_size="8KB")
    state = model.state_dict()
    out["bin_one"].mkdir()
    torch.save(state, out["bin_one"] / "pytorch_model.bin")
    config.save_pretrained(out["bin_one"])
    write_bin_shards(state, out["bin_sharded"])
    config.save_pretrained(out["bin_sharded"])
    saved = {k: v.detach().clone() for k, v in state.items()}  # training changes the model's

    class Tokens(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.arange(8) % 64
            return {"input_ids": ids, "labels": ids}

    args = TrainingArguments(output_dir=str(root / "run"), max_steps=2, save_steps=2,
                             per_device_train_batch_size=2, report_to=[], use_cpu=True,
                             disable_tqdm=True, logging_strategy="no")
    Trainer(model=model, args=args, train_dataset=Tokens()).train()
    out["trainer"] = root / "run" / "checkpoint-2"
    out["state"] = saved  # type: ignore[assignment]
    return out


def write_bin_shards(state: dict[str, Any], folder: Path, shards: int = 3) -> None:
    """``state`` as transformers 4 sharded it into ``.bin`` files: names grouped by
    storage (tied names in one shard), the groups spread over ``shards`` files, an index
    with ``metadata.total_size`` and the ``weight_map``."""
    import torch

    folder.mkdir(parents=True)
    groups: dict[int, list[str]] = {}
    for name, t in state.items():
        groups.setdefault(t.untyped_storage().data_ptr(), []).append(name)
    ordered = list(groups.values())
    files = [f"pytorch_model-{k + 1:05d}-of-{shards:05d}.bin" for k in range(shards)]
    weight_map: dict[str, str] = {}
    for i, names in enumerate(ordered):
        for name in names:
            weight_map[name] = files[i * shards // len(ordered)]
    total = 0
    for file in files:
        part = {n: state[n] for n, f in weight_map.items() if f == file}
        torch.save(part, folder / file)
        total += sum(t.numel() * t.element_size() for t in part.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2))


def torch_files(folder: Path) -> list[str]:
    """The checkpoint files of a folder, sorted."""
    return sorted(n for n in os.listdir(folder) if not n.endswith((".json", ".txt")))
