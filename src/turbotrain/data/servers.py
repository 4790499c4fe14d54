"""Real storage servers on loopback for tests and benchmarks: nginx over a directory, and moto's S3.

    with LocalNginx("/data/files", latency_s=0.02) as server:
        ds = tt.data.FileDataset([server.url + "/a.bin"])

``LocalNginx`` runs the Debian ``nginx`` binary (``scripts/ci-deps.sh`` installs it) with a config
of its own in a temp directory: ``/files/`` serves the directory directly, with nginx's
``limit_rate`` per connection when ``limit_rate`` is given, and ``latency_s`` of waiting before
the first byte (the echo module's ``echo_sleep``), which is how an object store is slow for small
files. The rate limit slows small files too: nginx 1.22 pauses bytes_sent / rate after each write
(it does not let a first second's worth through at full speed), so with ``limit_rate="1m"`` a 64 KB
file takes about 31 ms more, and with ``latency_s=0.02`` a request costs about 52 ms in all, like a
small-object GET on S3 or GCS (measured with curl). ``/status/<code>`` answers with that HTTP status
(403, 404, 500, 503), for fault tests.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["LocalNginx", "LocalS3", "nginx_binary", "free_port"]

_STATUSES = (403, 404, 500, 503)  # /status/<code> answers with that code, for fault tests
_ECHO_MODULE = "/usr/lib/nginx/modules/ngx_http_echo_module.so"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"{what} exited with code {proc.returncode} before listening on port {port}:\n{out}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout_s:.0f} s")


def _terminate(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout:
        proc.stdout.close()


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )


class LocalNginx:
    """nginx serving ``root`` at ``http://127.0.0.1:<port>/files/`` until stopped."""

    def __init__(
        self, root: str | os.PathLike, *, latency_s: float = 0.0, limit_rate: str | None = None, workers: int = 1
    ):
        self.root = Path(root).resolve()
        self.latency_s = latency_s
        self.limit_rate = limit_rate
        self.workers = workers
        self.port = 0
        self._proc: subprocess.Popen | None = None
        self._dir: tempfile.TemporaryDirectory | None = None

    @property
    def url(self) -> str:
        """The base URL of the served directory (no trailing slash)."""
        return f"http://127.0.0.1:{self.port}/files"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config(self, prefix: str) -> str:
        if self.latency_s and not os.path.exists(_ECHO_MODULE):
            raise RuntimeError(
                f"latency_s needs nginx's echo module ({_ECHO_MODULE}): install nginx-light, "
                "which brings libnginx-mod-http-echo"
            )
        load = f"load_module {_ECHO_MODULE};" if self.latency_s else ""
        user = "user root;" if os.geteuid() == 0 else ""  # workers must read the (private) temp dirs
        rate = f"limit_rate {self.limit_rate};" if self.limit_rate else ""
        temps = " ".join(f"{k}_temp_path {prefix}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        files = (
            f"location ~ ^/files/(.*)$ {{ echo_sleep {self.latency_s:.3f}; echo_exec /raw/$1; }}\n"
            f"    location /raw/ {{ internal; alias {self.root}/; autoindex on; {rate} }}"
            if self.latency_s
            else f"location /files/ {{ alias {self.root}/; autoindex on; {rate} }}"
        )
        statuses = " ".join(f"location = /status/{code} {{ return {code}; }}" for code in _STATUSES)
        return f"""{load}
{user}
worker_processes {self.workers};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 100000;
  {temps}
  server {{
    listen 127.0.0.1:{self.port};
    {files}
    {statuses}
  }}
}}
"""

    def start(self) -> "LocalNginx":
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed: run `bash scripts/ci-deps.sh` (apt-get install nginx-light)")
        self._dir = tempfile.TemporaryDirectory(prefix="turbotrain-nginx-")
        prefix = self._dir.name
        for attempt in range(5):
            self.port = free_port()
            conf = Path(prefix) / "nginx.conf"
            conf.write_text(self._config(prefix))
            self._proc = subprocess.Popen(
                [binary, "-e", "stderr", "-p", prefix, "-c", str(conf), "-g", "daemon off;"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            try:
                _wait_for_port(self.port, self._proc, "nginx")
                return self
            except RuntimeError:
                self.stop(keep_dir=True)
                if attempt == 4:
                    raise
        return self

    def stop(self, keep_dir: bool = False) -> None:
        _terminate(self._proc)
        self._proc = None
        if self._dir is not None and not keep_dir:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> "LocalNginx":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class LocalS3:
    """moto's standalone S3 server (``moto[server]``) on a loopback port until stopped."""

    def __init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict:
        """fsspec/s3fs options that reach this server."""
        return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": self.endpoint_url}}

    def start(self) -> "LocalS3":
        self.port = free_port()
        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        _wait_for_port(self.port, self._proc, "moto S3 server", timeout_s=60)
        return self

    def stop(self) -> None:
        _terminate(self._proc)
        self._proc = None

    def __enter__(self) -> "LocalS3":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
