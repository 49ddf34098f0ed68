"""Issue 30: the walk is torch's, and so is the dispatch by name.

A folder is laid out as an attacker would (a payload in a subfolder of a model folder,
beside and under a DCP ``.metadata``, in a dot-folder, under other suffixes, behind a
symlinked folder, and safetensors bytes that are also a V7 tar, named ``.pt`` and
``.bin``); real ``torch.load`` opens each payload file by path in the sandboxed oracle
(:mod:`loader_oracle`) and must run it; ``ptfile scan`` of the folder must then give each
of those files a non-zero record.  Benign folders torch and transformers write (Hugging
Face, trainer, DCP of both writers, sharded sets: :mod:`folders`) scan with exit 0.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
from contextlib import redirect_stdout
from pathlib import Path

import pytest

import ptfile
from loader_oracle import Job, run_loaders, sandbox
from ptfile.cli.commands import main
from tar_cases import Payload, dumps, tar_checkpoint

torch = pytest.importorskip("torch")


def polyglot(sentinel: str) -> bytes:
    """Safetensors bytes (one U8 tensor) whose first block is also a V7 tar header
    ``tarfile`` accepts: its numbers in the metadata's JSON string, the member it opens
    ending where the tensor's bytes begin, which are a torch 0.3 tar whose ``storages``
    pickle creates ``sentinel``."""
    tar = tar_checkpoint(storages=dumps(Payload(sentinel)), v7=True)
    block = bytearray(b"a" * 512)
    prefix = b'{"__metadata__":{"p":"'
    block[8:8 + len(prefix)] = prefix
    fields = {100: b"0000644 ", 108: b"0000000 ", 116: b"0000000 ", 124: b"%011o " % 512,
              136: b"00000000000 ", 156: b"0", 329: b" " * 16}  # 329: devmajor, devminor
    for at, value in fields.items():
        block[at:at + len(value)] = value
    block[:8] = struct.pack("<Q", 1016)  # 8 + 1016: the first tar member ends at 1024
    rest = b'"},"x":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (len(tar), len(tar))
    header = bytes(block[8:]) + rest
    header += b" " * (1016 - len(header))
    head = bytearray(block[:8] + header[:504])
    head[148:156] = b" " * 8
    head[148:156] = b"%06o  " % sum(head)
    return bytes(head) + header[504:] + tar


#: Where each payload goes in the layout, and how it is written.
LAYOUT = {
    "model/checkpoint-500/optimizer.pt": "pickle",     # under a model folder
    "dcp/extra.pt": "pickle",                          # beside .metadata
    "dcp/sub/x.bin": "pickle",                         # under it
    ".cache/model.pt": "pickle",                       # a dot-folder
    "model.weights": "pickle",                         # other suffixes
    "pytorch_model.bin.1": "pickle",
    "linked/p.pt": "pickle",                           # behind a symlinked folder
    "poly.pt": "polyglot",                             # safetensors bytes, torch's tar
    "poly.bin": "polyglot",
}


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from safetensors.torch import save_file
    from torch.distributed import checkpoint as dcp

    root = tmp_path_factory.mktemp("walk").resolve()
    files, sentinels = sandbox(root)
    tree = files / "repo"
    (tree / "model").mkdir(parents=True)
    save_file({"w": torch.ones(2, 2)}, str(tree / "model" / "model.safetensors"))
    (tree / "model" / "config.json").write_text("{}")
    (tree / "model" / "checkpoint-500").mkdir()
    save_file({"w": torch.ones(2)}, str(tree / "model" / "checkpoint-500" / "model.safetensors"))
    dcp.save({"w": torch.ones(3)}, checkpoint_id=str(tree / "dcp"))
    outside = files / "outside"
    outside.mkdir()
    (tree / "linked").symlink_to(outside, target_is_directory=True)
    (tree / "loop").mkdir()
    (tree / "loop" / "again").symlink_to(tree / "loop", target_is_directory=True)
    (tree / "README.md").write_text("# a repository\n")
    for i, (where, kind) in enumerate(LAYOUT.items()):
        path = (outside / "p.pt") if where.startswith("linked/") else tree / where
        path.parent.mkdir(parents=True, exist_ok=True)
        sentinel = str(sentinels / f"s{i}")
        path.write_bytes(polyglot(sentinel) if kind == "polyglot"
                         else pickle.dumps(Payload(sentinel), protocol=2))
    return tree, root


def scan_cli(*args: object) -> tuple[int, list[dict[str, object]]]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["scan", *map(str, args), "--format", "jsonl"])
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def test_every_payload_torch_runs_in_a_folder_fails_the_scan(layout: tuple[Path, Path]) -> None:
    tree, root = layout
    jobs = [Job(f"p{i}", tree / where, root / "sentinels" / f"s{i}",
                ("torch.load(weights_only=False)",)) for i, where in enumerate(LAYOUT)]
    outcomes = run_loaders(root, jobs)
    assert all(o.fired for o in outcomes), [(j.path.name, o.errors) for j, o in
                                            zip(jobs, outcomes, strict=True) if not o.fired]
    code, lines = scan_cli(tree, "--list-skipped")
    *records, summary = lines
    by_path = {os.path.relpath(str(r["path"]), tree): r for r in records}
    assert code == 1
    for where in LAYOUT:  # its own record, or its checkpoint folder's (a set's part)
        record = next(by_path[p] for p in (where, *(str(q) for q in Path(where).parents))
                      if p in by_path)
        assert record["exit_code"] != 0, (where, record)
    # the README is skipped and listed; the link out is named; the loop walked once
    assert summary["skipped_files"] == [str(tree / n) for n in ("README.md",
                                                                "model/config.json")]
    assert summary["outside"] == {str(tree / "linked" / "p.pt"): str(root / "files" /
                                                                    "outside" / "p.pt")}
    assert summary["repeated"] == [str(tree / "loop" / "again")]
    # the checkpoint folders scanned whole find their strays; --exclude is the way out
    assert ptfile.scan(tree / "dcp").is_dangerous and ptfile.scan(tree / "model").is_dangerous
    assert not ptfile.scan(tree / "dcp", whole=False).is_dangerous
    code, lines = scan_cli(tree, *(f"--exclude={g}" for g in
                                   ("dcp/*", ".cache", "*.weights", "*.1", "linked", "poly.*",
                                    "checkpoint-500")))
    assert code == 0, lines


def test_a_polyglot_is_judged_by_its_name_as_torch_reads_it(tmp_path: Path) -> None:
    data = polyglot(str(tmp_path / "never"))
    for name, dangerous in (("m.safetensors", False), ("m.pt", True), ("m.bin", True)):
        (tmp_path / name).write_bytes(data)
        assert ptfile.scan(tmp_path / name).is_dangerous is dangerous, name


def test_benign_torch_written_folders_scan_clean(tmp_path: Path) -> None:
    from torch.distributed import checkpoint as dcp

    from folders import make_zoo

    zoo = make_zoo(tmp_path / "zoo")
    dcp.save({"w": torch.ones(3), "step": 3}, checkpoint_id=str(tmp_path / "zoo" / "dcp"))
    writer = getattr(dcp, "HuggingFaceStorageWriter", None)
    if writer is not None:
        dcp.save({"w": torch.ones(3)}, storage_writer=writer(str(tmp_path / "zoo" / "hf_dcp")))
    (tmp_path / "zoo" / "notes.txt").write_text("cmake_minimum_required(VERSION 3.10)\n")
    code, lines = scan_cli(tmp_path / "zoo")
    *records, summary = lines
    # A trainer folder's rng_state.pth (numpy's RNG state) and training_args.bin
    # (TrainingArguments) name globals outside the default allowlist, allowed there by the
    # role the folder gives them (scanning.allowing.ROLE_ALLOWED): every folder is clean.
    trainer = str(zoo["trainer"])
    assert code == 0 and summary["verdicts"] == {"allowed": len(records)}, records
    assert ptfile.scan(trainer).verdict.value == "allowed"
    for name in ("st_one", "st_sharded", "bin_one", "bin_sharded"):
        result = ptfile.scan(zoo[name])
        assert result.verdict.value == "allowed", (name, result.to_dict())
