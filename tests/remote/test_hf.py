"""``hf://`` checkpoints read through huggingface_hub's own ``HfFileSystem``.

The client is the real one, pointed with ``HF_ENDPOINT`` at a loopback server that answers
the Hub's file endpoints (``hubserver.py``): repository info, tree listings, paths-info and
``resolve`` with byte ranges.  Nothing here reaches the network.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import ptfile
from commands import Ran, run_each
from hubserver import HubServer
from oracle import assert_same

pytest.importorskip("huggingface_hub")

N_LAYERS = 64  # model.pt: 64 tensors of 256 KiB (16 MiB)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, ("echo pwned",)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A model repository: a state dict, a small file in a subfolder, a hostile pickle
    in another, and a README (not a checkpoint)."""
    root = tmp_path_factory.mktemp("tiny")
    gen = torch.Generator().manual_seed(25)
    torch.save({f"layers.{i}.weight": torch.randn(256, 256, generator=gen)
                for i in range(N_LAYERS)}, root / "model.pt")
    (root / "sub").mkdir()
    torch.save({"step": 3, "bias": torch.arange(7).to(torch.bfloat16)}, root / "sub/extra.bin")
    (root / "untrusted").mkdir()
    (root / "untrusted/evil.pt").write_bytes(pickle.dumps({"x": _Evil()}, protocol=2))
    (root / "README.md").write_text("# tiny\n")
    yield root
    shutil.rmtree(root)  # 16 MiB: more than a passing run may leave behind


@pytest.fixture(scope="module")
def hub(repo: Path) -> Iterator[HubServer]:
    """The server, and huggingface_hub pointed at it in this process.  Its constants are
    read once, at import, so the environment alone would miss a module imported earlier;
    the ``resolve`` URL template and the Hub's hosts are derived from the endpoint then."""
    with HubServer({"user/tiny": repo, "datasets/user/data": repo / "sub"},
                   page_size=2) as server, \
            pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_ENDPOINT", server.endpoint)
        mp.setenv("HF_HUB_OFFLINE", "0")
        mp.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        mp.delenv("HF_TOKEN", raising=False)
        from huggingface_hub import constants

        mp.setattr(constants, "ENDPOINT", server.endpoint)
        mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                   server.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        mp.setattr(constants, "HF_URL_HOSTS",
                   frozenset(getattr(constants, "HF_URL_HOSTS", ())) | {"127.0.0.1"},
                   raising=False)
        mp.setattr(constants, "HF_HUB_OFFLINE", False)
        mp.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        from huggingface_hub import hf_hub_url

        assert hf_hub_url("user/tiny", "model.pt").startswith(server.endpoint + "/")
        yield server
        assert all(r.handled for r in server.log), [r for r in server.log if not r.handled]


def cli(hub: HubServer, tmp_path: Path, *commands: list[str]) -> list[Ran]:
    """Each ``ptfile`` command line's outcome, all run in one fresh process whose
    huggingface_hub reads HF_ENDPOINT (:func:`commands.run_each`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1",
               HF_HOME=str(tmp_path / "hf-home"))
    return run_each(*commands, env=env)


def test_hf_load_equals_torch(hub: HubServer, repo: Path) -> None:
    assert_same(ptfile.load("hf://user/tiny/model.pt"), torch.load(repo / "model.pt"))
    assert_same(ptfile.load("hf://user/tiny/sub/extra.bin"), torch.load(repo / "sub/extra.bin"))
    assert_same(ptfile.load("hf://user/tiny@main/sub/extra.bin"),
                torch.load(repo / "sub/extra.bin"))
    assert_same(ptfile.load("hf://datasets/user/data/extra.bin"),
                torch.load(repo / "sub/extra.bin"))
    gets = [r for r in hub.log if "/resolve/" in r.path and r.method == "GET"]
    assert gets and all(r.range and r.status == 206 for r in gets)  # ranges, never whole


def test_hf_open_fetches_only_the_needed_ranges(hub: HubServer, repo: Path) -> None:
    size = (repo / "model.pt").stat().st_size
    ref = torch.load(repo / "model.pt")["layers.37.weight"]
    hub.reset()
    with ptfile.open("hf://user/tiny/model.pt") as ck:
        assert len(ck.keys()) == N_LAYERS
        np.testing.assert_array_equal(ck.get_tensor("layers.37.weight"), ref.numpy())
    served = hub.served("model.pt")
    assert served < size / 10, (served, size)  # metadata and one 256 KiB tensor of 16 MiB
    gets = [r for r in hub.log if r.path.endswith("model.pt") and r.method == "GET"]
    assert gets and all(r.range.startswith("bytes=") and r.status == 206 for r in gets)
    assert len(gets) <= 5, gets


def test_hf_scan_and_inspect(hub: HubServer) -> None:
    assert not ptfile.scan("hf://user/tiny/model.pt").is_dangerous
    assert ptfile.scan("hf://user/tiny/untrusted/evil.pt").is_dangerous
    info = ptfile.inspect("hf://user/tiny/model.pt")
    assert len(info.tensors) == N_LAYERS


def test_hf_folder_listing_for_bulk(hub: HubServer) -> None:
    from ptfile import bulk

    # page_size=2: the listing follows the tree endpoint's Link pages
    assert bulk.expand("hf://user/tiny") == ["hf://user/tiny/model.pt",
                                             "hf://user/tiny/sub/extra.bin",
                                             "hf://user/tiny/untrusted/evil.pt"]
    assert bulk.expand("hf://user/tiny/sub/") == ["hf://user/tiny/sub/extra.bin"]
    assert any("/tree/main" in r.path for r in hub.log)


def test_hf_cli_scan_folder_and_inspect(hub: HubServer, tmp_path: Path) -> None:
    done, scanned, inspected = cli(
        hub, tmp_path, ["scan", "hf://user/tiny", "--json"], ["scan", "hf://user/tiny/model.pt"],
        ["inspect", "hf://user/tiny/model.pt", "--json"])
    assert done.returncode == 1, done.stderr  # the hostile pickle is found
    *files, summary = map(json.loads, done.stdout.splitlines())
    assert summary["summary"] and summary["exit_code"] == 1
    records = {r["path"]: r for r in files}
    assert set(records) == {"hf://user/tiny/model.pt", "hf://user/tiny/sub/extra.bin",
                            "hf://user/tiny/untrusted/evil.pt"}
    assert [p for p, r in records.items() if r["exit_code"] == 1] == \
        ["hf://user/tiny/untrusted/evil.pt"]

    assert scanned.returncode == 0, scanned.stderr
    assert inspected.returncode == 0, inspected.stderr
    assert len(json.loads(inspected.stdout)["tensors"]) == N_LAYERS


MISSING = {"hf://user/tiny/missing.pt": "not found",
           "hf://user/nothing/model.pt": "repository not found",
           "hf://user/tiny@v9/model.pt": "revision not found"}


@pytest.fixture(scope="module")
def inspect_missing(hub: HubServer,
                    tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    """``ptfile inspect URL`` for each missing URL, all in one process: by URL."""
    tmp = tmp_path_factory.mktemp("missing")
    return dict(zip(MISSING, cli(hub, tmp, *(["inspect", url] for url in MISSING))))


@pytest.mark.parametrize(("url", "why"), list(MISSING.items()),
                         ids=["file", "repository", "revision"])
def test_hf_missing_is_exit_2_with_a_clear_message(
        hub: HubServer, inspect_missing: dict[str, Ran], url: str, why: str) -> None:
    with pytest.raises(ptfile.RemoteError, match=why) as info:
        ptfile.load(url)
    assert info.value.status == 404
    done = inspect_missing[url]
    assert done.returncode == 2
    assert url in done.stderr and why in done.stderr and "Traceback" not in done.stderr


def test_missing_backends_name_the_package_and_the_extra() -> None:
    """Without the backend package, each scheme's error says what to install; importing
    ptfile (and its CLI) never imports huggingface_hub."""
    code = """
import sys
import ptfile, ptfile.cli
assert "huggingface_hub" not in sys.modules and "torch" not in sys.modules
for pkg, url in [("huggingface_hub", "hf://user/tiny/model.pt"), ("s3fs", "s3://b/m.pt"),
                 ("gcsfs", "gs://b/m.pt")]:
    sys.modules[pkg] = None  # importing it fails
    try:
        ptfile.open(url)
    except ptfile.UnsupportedFeatureError as exc:
        print(exc)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    hf, s3, gcs = done.stdout.splitlines()
    assert "pip install huggingface_hub" in hf and "ptfile's hf extra" in hf
    assert "pip install s3fs" in s3 and "ptfile's s3 extra" in s3
    assert "pip install gcsfs" in gcs and "ptfile's gcs extra" in gcs
