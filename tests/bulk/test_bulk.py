"""ptfile.bulk on local trees: expansion, the local pools against a sequential run, bulk
convert (resumable, never partial), retries, and the command line's JSON Lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import ptfile
from bulk_corpus import EXPECTED, corpus, die_on, kind_of
from ptfile import bulk

#: Fields that differ between runs.
TIMING = ("seconds",)


def comparable(records: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in bulk.ordered(records)]


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zoo")
    write_tree(root, corpus(48))
    (root / "README.md").write_text("not a checkpoint name")
    return root


def test_expand_walks_directories_globs_and_keeps_named_files(tree: Path) -> None:
    (tree / ".cache").mkdir(exist_ok=True)
    (tree / ".cache" / "hidden.pt").write_bytes(b"x")
    walked = bulk.expand(tree)
    excluded = bulk.expand(tree, exclude=[".cache"])
    (tree / ".cache" / "hidden.pt").unlink()
    # issue 30: torch opens dot-folders' files too (.cache/hidden.pt); the README is
    # no checkpoint by name or bytes: skipped, and listed as such
    assert len(walked) == 49 and walked == sorted(walked)
    assert str(tree / ".cache" / "hidden.pt") in walked
    assert not any("README" in p for p in walked)
    assert bulk.walk(tree).skipped == [str(tree / "README.md")]
    assert excluded == [p for p in walked if ".cache" not in p] and len(excluded) == 48
    # a glob takes what it matches, whatever the name; duplicates go
    pattern = str(tree / "d00" / "*-clean.pt")
    both = bulk.expand([pattern, str(tree / "d00"), str(tree / "README.md")])
    assert len(bulk.expand(pattern)) == 6 and set(bulk.expand(pattern)) <= set(both)
    assert str(tree / "README.md") in both and len(both) == 48 + 1
    assert bulk.expand(str(tree / "missing.pt")) == [str(tree / "missing.pt")]


def test_expand_treats_a_distributed_checkpoint_as_one_input(tmp_path: Path) -> None:
    (tmp_path / "run" / "dcp").mkdir(parents=True)
    (tmp_path / "run" / "dcp" / ".metadata").write_bytes(b"")
    (tmp_path / "run" / "dcp" / "__0_0.distcp").write_bytes(b"")
    (tmp_path / "run" / "last.pt").write_bytes(b"")
    assert bulk.expand(tmp_path) == [str(tmp_path / "run" / "dcp"), str(tmp_path / "run" / "last.pt")]
    assert bulk.expand(tmp_path / "run" / "dcp") == [str(tmp_path / "run" / "dcp")]
    assert not bulk.expands(str(tmp_path / "run" / "dcp")) and bulk.expands(str(tmp_path))


def test_expand_treats_a_per_rank_metadata_folder_as_one_input(tmp_path: Path) -> None:
    """use_collectives=False writes __<rank>.metadata and no .metadata."""
    ranks = tmp_path / "run" / "ranks"
    ranks.mkdir(parents=True)
    for name in ("__0.metadata", "__1.metadata", "__0_0.distcp", "__1_0.distcp"):
        (ranks / name).write_bytes(b"")
    assert bulk.expand(tmp_path) == [str(ranks)]
    assert not bulk.expands(str(ranks))


def test_expand_url_prefixes_and_globs_through_fsspec() -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for name in ("zoo/a/m.bin", "zoo/b/m.pt", "zoo/b/notes.txt", "zoo/.git/x.pt"):
        fs.pipe(name, b"x")
    def names(urls: list[str]) -> list[str]:
        assert all(u.startswith("memory://") for u in urls)  # fsspec's own spelling
        return [u.split("zoo/", 1)[1] for u in urls]

    # every file, dot-folders included; notes.txt is no checkpoint by name or bytes
    assert names(bulk.expand("memory://zoo/")) == [".git/x.pt", "a/m.bin", "b/m.pt"]
    assert names(bulk.walk("memory://zoo/").skipped) == ["b/notes.txt"]
    assert names(bulk.expand("memory://zoo/", exclude=[".git"])) == ["a/m.bin", "b/m.pt"]
    assert bulk.expand("memory://zoo") == bulk.expand("memory://zoo/")
    assert names(bulk.expand("memory://zoo/**/*.txt")) == ["b/notes.txt"]
    assert bulk.expand("memory://zoo/b/m.pt") == ["memory://zoo/b/m.pt"]


@pytest.mark.parametrize("command", ["scan", "verify"])
def test_bulk_verdicts_follow_the_file_kinds(tree: Path, command: str) -> None:
    records = bulk.ordered(getattr(bulk, command)(tree, pool="serial"))
    assert len(records) == 48
    for r in records:
        assert r["verdict"] == EXPECTED[command][kind_of(r["path"])], r
        assert r["ok"] is (r["exit_code"] == 0) and r["bytes_fetched"] is None
    assert bulk.summarize(records)["exit_code"] == 1


def test_inspect_records_errors_and_never_stops(tree: Path) -> None:
    records = bulk.ordered(bulk.inspect(tree, pool="serial"))
    bad = {kind_of(r["path"]): r["error"]["type"] for r in records if r["error"]}
    assert bad == {"dangerous-zip": "UnsafeGlobalError", "dangerous-pickle": "UnknownFormatError",
                   "damaged": "ArchiveError", "not-a-checkpoint": "UnknownFormatError"}
    good = [r for r in records if r["ok"]]
    assert len(good) == 24 and all(r["result"]["totals"]["tensors"] == 1 for r in good)


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_local_pools_give_the_sequential_results(tree: Path, pool: str) -> None:
    sequential = comparable(bulk.scan(tree, pool="serial"))
    assert comparable(bulk.scan(tree, pool=pool, workers=2)) == sequential


def test_worst_code_order() -> None:
    assert bulk.WORST_FIRST == (bulk.EXIT_UNSAFE, bulk.EXIT_ERROR, bulk.EXIT_UNKNOWN)
    assert bulk.worst([0, 3]) == 3 and bulk.worst([3, 2]) == 2 and bulk.worst([2, 1, 3]) == 1


def test_convert_mirrors_under_a_prefix_resumes_and_matches_torch(tree: Path,
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = bulk.ordered(bulk.convert(tree, str(out)))
    converted = [r for r in first if r["verdict"] == "converted"]
    assert {kind_of(r["path"]) for r in converted} == {"clean", "clean2", "torch", "legacy"}
    for r in converted:
        rel = Path(r["path"]).relative_to(tree).with_suffix(".safetensors")
        assert r["result"]["output"] == f"{out}/{rel}"
        want = torch.load(r["path"], weights_only=True)["w"]
        assert torch.equal(load_file(out / rel)["w"], want)
    failed = [r for r in first if r["verdict"] == "error"]
    assert len(failed) == 24  # each failed file left nothing behind, not even a temp folder
    assert sorted(p.name for p in out.rglob("*")
                  if p.is_file()) == sorted(Path(r["result"]["output"]).name for r in converted)
    assert not list(out.rglob(".*.tmp"))  # no staging folder left either
    again = bulk.ordered(bulk.convert(tree, str(out)))
    assert [r["verdict"] for r in again] == ["skipped" if r["verdict"] == "converted" else "error"
                                              for r in first]


def test_convert_beside_the_inputs_and_refuses_the_same_format(tmp_path: Path) -> None:
    ptfile.save({"w": np.ones(2, "float32")}, tmp_path / "m.bin")
    (tmp_path / "x.safetensors").write_bytes(b"")
    [r] = bulk.convert(tmp_path / "m.bin", fmt="pt")
    assert r["verdict"] == "converted" and r["result"]["output"] == str(tmp_path / "m.pt")
    assert torch.equal(torch.load(tmp_path / "m.pt")["w"], torch.ones(2))
    [r] = bulk.convert(str(tmp_path / "x.safetensors"))
    assert r["error"]["type"] == "UnsupportedFeatureError"
    with pytest.raises(ptfile.UnsupportedFeatureError):
        bulk.convert(tmp_path, fmt="h5")


def test_transient_errors_are_retried_permanent_ones_are_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def flaky(url: str, options: Any, target: Any) -> tuple[str, dict[str, Any]]:
        calls.append(url)
        if url == "gone.pt":
            raise FileNotFoundError(url)
        if calls.count(url) < 3:
            raise ConnectionResetError("reset by peer")
        return "allowed", {}

    monkeypatch.setitem(bulk.tasks.COMMANDS, "scan", flaky)
    records = {r["path"]: r for r in bulk.scan(["flaky.pt", "gone.pt"], pool="serial")}
    assert (records["flaky.pt"]["verdict"], records["flaky.pt"]["attempts"]) == ("allowed", 3)
    assert (records["gone.pt"]["error"]["type"], records["gone.pt"]["attempts"]) == \
        ("FileNotFoundError", 1)
    [r] = bulk.scan(["flaky2.pt"], pool="serial", retries=1)
    assert (r["error"]["type"], r["attempts"]) == ("ConnectionResetError", 2)


def test_dask_missing_is_an_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(ptfile.UnsupportedFeatureError, match=r"dask\[distributed\].*dask extra"):
        list(bulk.scan(["a.pt"], client=object()))


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ptfile", *map(str, args)], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_cli_directory_gives_json_lines_and_the_worst_code(tree: Path) -> None:
    result = cli("scan", tree / "d00", "--workers", "2")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    *records, summary = lines
    assert len(records) == 48 and summary["summary"] is True and summary["files"] == 48
    assert result.returncode == summary["exit_code"] == 1
    assert summary["verdicts"] == {"allowed": 24, "dangerous": 12, "error": 12}
    # inspect: errors (2) win over ok; several named files are a bulk run too
    names = sorted(str(p) for p in (tree / "d00").glob("*-clean*"))
    result = cli("inspect", *names, str(tree / "d00" / "0006-damaged.bin"))
    assert result.returncode == 2 and len(result.stdout.splitlines()) == len(names) + 2
    one = cli("scan", names[0], "--jsonl")
    assert [json.loads(line)["exit_code"] for line in one.stdout.splitlines()] == [0, 0]
    assert cli("scan", tree / "nothing-*.pt").returncode == 2


def test_cli_bulk_convert_and_rerun(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "st"
    first = cli("convert", tree / "d00", "--out-prefix", out, "--to", "npz")
    assert first.returncode == 2  # the damaged and dangerous files are errors
    summary = json.loads(first.stdout.splitlines()[-1])
    assert summary["verdicts"] == {"converted": 24, "error": 24}
    second = json.loads(cli("convert", tree / "d00", "--out-prefix", out, "--to", "npz")
                        .stdout.splitlines()[-1])
    assert second["verdicts"] == {"skipped": 24, "error": 24}
    # two names without a bulk option: one conversion, as before
    single = cli("convert", tree / "d00" / "0000-clean.pt", tmp_path / "one.safetensors")
    assert single.returncode == 0 and single.stdout.startswith("wrote ")


def test_process_pool_outlives_a_worker_that_dies() -> None:
    """A dead worker breaks a ProcessPoolExecutor and fails every future in flight: those
    files run again, each alone, so only the one that kills its process is an error."""
    from ptfile.bulk.execution import _on_pool

    urls = [f"f{i}" for i in range(10)] + ["die"] + [f"g{i}" for i in range(10)]
    jobs = [("scan", url, None, None) for url in urls]
    records = list(_on_pool(jobs, "process", 2, work=die_on))  # type: ignore[arg-type]
    assert sorted(r["path"] for r in records) == sorted(urls)
    by_url = {r["path"]: r for r in records}
    assert by_url["die"]["verdict"] == "error" and by_url["die"]["exit_code"] == 2
    assert all(by_url[u]["ok"] for u in urls if u != "die")


def test_pool_that_breaks_before_a_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool can break after the last future was read and before the next submit (the
    race CI hit: ``submit`` raised BrokenProcessPool out of the run).  The jobs then in
    flight, and the one being submitted, are run again on a fresh pool."""
    import concurrent.futures as cf
    import concurrent.futures.process as cfp

    from ptfile.bulk import execution

    pools: list[cf.ThreadPoolExecutor] = []

    class BreaksOnce(cf.ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
            if args[1] == "g1" and len(pools) == 1:
                raise cfp.BrokenProcessPool("a child process terminated abruptly")
            return super().submit(fn, *args, **kwargs)

    def executor(kind: str, workers: int | None) -> cf.Executor:
        pools.append(BreaksOnce(workers))
        return pools[-1]

    monkeypatch.setattr(execution, "_executor", executor)
    urls = [f"f{i}" for i in range(10)] + [f"g{i}" for i in range(10)]
    records = list(execution._on_pool([("scan", u, None, None) for u in urls], "process", 2,
                                      work=die_on))  # type: ignore[arg-type]
    assert sorted(r["path"] for r in records) == sorted(urls)
    assert all(r["ok"] for r in records) and len(pools) == 2
