"""The moto S3 server the remote tests share (one per session: moto's backend is process-wide,
so a second server would see the first one's bucket)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def s3() -> Iterator[dict[str, Any]]:
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {"client_kwargs": {"endpoint_url": f"http://{host}:{port}"},
                   "key": "testing", "secret": "testing", "skip_instance_cache": True}
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir("models")
        yield {"fs": fs, "options": options}
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
