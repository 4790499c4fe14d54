"""Real servers for the data tests: nginx over a directory, moto's S3, and a small fault-injecting HTTP server.

nginx is required, not optional: `make test` installs it through scripts/ci-deps.sh, and a missing
nginx fails these tests with that instruction instead of skipping them.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from datahelpers import FaultHandler, FaultServer, content_for

from turbotrain.data.servers import LocalNginx, nginx_binary

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # s3fs must not probe a cloud metadata service


@pytest.fixture(scope="session")
def served_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("served")
    for i in range(48):
        name = f"f{i:03d}.bin"
        (root / name).write_bytes(content_for(name, 1024 + 97 * i))
    return root


@pytest.fixture(scope="session")
def nginx(served_dir):
    if nginx_binary() is None:
        pytest.fail("nginx is not installed: run `bash scripts/ci-deps.sh` (make test does it)")
    with LocalNginx(served_dir, latency_s=0.002) as server:
        yield server


@pytest.fixture
def served_urls(nginx, served_dir) -> list[str]:
    return [f"{nginx.url}/{p.name}" for p in sorted(served_dir.iterdir())]


@pytest.fixture(scope="session")
def fault_server():
    server = FaultServer(("127.0.0.1", 0), FaultHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def cache_dir(tmp_path) -> Path:
    return tmp_path / "cache"
