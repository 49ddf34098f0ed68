"""ptfile.bulk on Dask: a LocalCluster of 2 worker processes on 127.0.0.1 against moto's S3
server on loopback, 240 small checkpoints (clean, dangerous, damaged, not checkpoints)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from bulk_corpus import corpus, kind_of
from ptfile import bulk

moto_server = pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
distributed = pytest.importorskip("distributed")

N_FILES = 240
TIMING = ("seconds",)


def comparable(records: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in bulk.ordered(records)]


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, Any]]:
    import s3fs

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {"client_kwargs": {"endpoint_url": f"http://{host}:{port}"},
                   "key": "testing", "secret": "testing"}  # one cached s3fs per process
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir("zoo")
        fs.pipe({f"zoo/models/{name}": data for name, data in corpus(N_FILES).items()})
        yield {"fs": fs, "options": options}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with bulk.local_cluster(n_workers=2, threads_per_worker=1) as cluster, \
            distributed.Client(cluster) as c:
        addresses = [cluster.scheduler_address, *c.scheduler_info()["workers"]]
        assert len(addresses) == 3 and all(a.startswith("tcp://127.0.0.1:") for a in addresses)
        yield c


@pytest.fixture(scope="module")
def sequential(s3: dict[str, Any]) -> list[dict[str, Any]]:
    return comparable(bulk.scan("s3://zoo/models/", pool="serial",
                                storage_options=s3["options"]))


def test_bulk_s3_sequential_verdicts_and_bytes(s3: dict[str, Any],
                                                sequential: list[dict[str, Any]]) -> None:
    assert len(sequential) == N_FILES
    assert all(r["path"].startswith("s3://zoo/models/d0") for r in sequential)
    verdicts = {kind_of(r["path"]): r["verdict"] for r in sequential}
    assert verdicts["dangerous-zip"] == verdicts["dangerous-pickle"] == "dangerous"
    assert verdicts["clean"] == verdicts["torch"] == verdicts["legacy"] == "allowed"
    assert all(r["bytes_fetched"] > 0 and r["requests"] >= 1 for r in sequential)
    assert bulk.expand("s3://zoo/models/**/*-damaged.bin", s3["options"]) == \
        [r["path"] for r in sequential if kind_of(r["path"]) == "damaged"]


def test_bulk_s3_threads_and_dask_equal_the_sequential_run(
        s3: dict[str, Any], client: Any, sequential: list[dict[str, Any]]) -> None:
    threads = bulk.scan("s3://zoo/models/", workers=8, storage_options=s3["options"])
    assert comparable(threads) == sequential
    on_dask = bulk.scan("s3://zoo/models/**/*", client=client, storage_options=s3["options"])
    assert comparable(on_dask) == sequential


def test_bulk_dask_worker_killed_mid_run_loses_no_result(
        s3: dict[str, Any], client: Any, sequential: list[dict[str, Any]]) -> None:
    got = []
    killed = None
    for record in bulk.scan("s3://zoo/models/", client=client, storage_options=s3["options"]):
        got.append(record)
        if len(got) == 20:
            workers = client.scheduler_info()["workers"]
            busy = [addr for addr, info in workers.items() if info.get("metrics", {})
                    .get("task_counts", {}).get("processing", 1)]
            killed = min(busy or workers)
            with contextlib.suppress(Exception):  # the worker dies before it answers
                client.run(os._exit, 1, workers=[killed])
    assert killed is not None and killed not in client.scheduler_info()["workers"]
    assert comparable(got) == sequential
    assert len({r["path"] for r in got}) == N_FILES


def test_bulk_dask_convert_to_an_s3_prefix_resumes(s3: dict[str, Any], client: Any) -> None:
    options = s3["options"]
    inputs = "s3://zoo/models/d00/*-clean.pt"
    first = bulk.ordered(bulk.convert(inputs, "s3://zoo/out", client=client,
                                      storage_options=options))
    assert [r["verdict"] for r in first] == ["converted"] * len(first) and len(first) == 7
    assert sorted(s3["fs"].find("zoo/out")) == sorted(
        r["result"]["output"].removeprefix("s3://") for r in first)
    assert first[0]["result"]["output"] == "s3://zoo/out/0000-clean.safetensors"
    again = bulk.convert(inputs, "s3://zoo/out", client=client, storage_options=options)
    assert {r["verdict"] for r in again} == {"skipped"}


def test_bulk_cli_on_a_local_dask_cluster_with_storage_options(s3: dict[str, Any]) -> None:
    endpoint = s3["options"]["client_kwargs"]["endpoint_url"]
    options = [f"client_kwargs={json.dumps({'endpoint_url': endpoint})}", "key=testing",
               "secret=testing"]
    result = subprocess.run(
        [sys.executable, "-m", "ptfile", "scan", "s3://zoo/models/d01/", "--dask", "--workers",
         "1", *(x for o in options for x in ("--storage-option", o))],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    *records, summary = map(json.loads, result.stdout.splitlines())
    assert summary["files"] == len(records) == 50 and result.returncode == 1
    assert {r["verdict"] for r in records} == {"allowed", "dangerous", "error"}
    assert summary["bytes_fetched"] == sum(r["bytes_fetched"] for r in records) > 0
