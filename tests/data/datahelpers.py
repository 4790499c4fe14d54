"""Helpers shared by the data tests (fixtures are in conftest.py)."""

from __future__ import annotations

import hashlib
import socket
import socketserver
import struct
import threading
import time
from pathlib import Path


def content_for(name: str, size: int = 4096) -> bytes:
    """Deterministic bytes for a file name (so any server can recreate what the test expects)."""
    seed = hashlib.sha256(name.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


class FaultHandler(socketserver.BaseRequestHandler):
    """GET /<mode>/<name>: ok, reset, stall, truncate, or flaky-N (the first N requests for a path fail with 500).

    Only GETs count and answer; anything else (a directory listing, a HEAD for a file's version) gets 405,
    like a store that cannot list, so the counts are the reads of the file itself.
    """

    counts: dict[str, int] = {}
    lock = threading.Lock()

    def handle(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            data += chunk
        method, path = data.split(b" ", 2)[:2]
        path = path.decode()
        _, mode, name = path.split("/", 2)
        if method != b"GET" or not name:
            self.request.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        with self.lock:
            self.counts[path] = seen = self.counts.get(path, 0) + 1
        body = content_for(name)
        if mode == "reset" or (mode.startswith("flakyreset-") and seen <= int(mode.split("-")[1])):
            # SO_LINGER 0: close() sends a RST, which the client sees as "connection reset by peer".
            self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.request.close()
            return
        if mode == "stall":
            time.sleep(5)
            return
        if mode.startswith("flaky-") and seen <= int(mode.split("-")[1]):
            self.request.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n"
                                 b"Connection: close\r\n\r\n")
            return
        header = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        if mode == "truncate" or (mode.startswith("flakytrunc-") and seen <= int(mode.split("-")[1])):
            self.request.sendall(header + body[: len(body) // 2])
            return
        self.request.sendall(header + body)


class FaultServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def fault_requests(path: str) -> int:
    """How many requests the fault server has seen for ``path``."""
    return FaultHandler.counts.get(path, 0)


def leftover_temps(root: Path) -> list[str]:
    return [p.name for p in root.rglob(".tmp-*")] if root.exists() else []


def unmount(mount: Path) -> None:
    """Unmount a test's tmpfs. Lazily when it is busy: a cache write still running on the cache's own threads can
    hold a file open there after the test's loop died of a full disk, and a mount left behind stops pytest removing
    its temporary folders (and holds memory) until the machine restarts."""
    import subprocess

    if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
