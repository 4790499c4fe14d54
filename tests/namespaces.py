"""Two nodes on one machine: two network namespaces joined by a veth pair.

Each namespace has its own network stack (its own interfaces, addresses and ports), so two processes in them can
only meet over the veth link, exactly like two hosts on a network: node 0 at 10.77.x.1, node 1 at 10.77.x.2.
Needs root and iproute2 (`scripts/ci-deps.sh` installs it); the test is skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def _can_make_namespaces() -> str | None:
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (scripts/ci-deps.sh installs it)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"tt-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@contextmanager
def two_network_nodes() -> Iterator[list[tuple[str, str, str]]]:
    """``[(namespace, veth device, address)]`` for nodes 0 and 1; removed afterwards."""
    why = _can_make_namespaces()
    if why:
        pytest.skip(why)
    tag = f"tt{os.getpid() % 100000}"
    subnet = f"10.77.{os.getpid() % 250}"
    nodes = []
    try:
        for n in (0, 1):
            _sh("ip", "netns", "add", f"{tag}n{n}")
            nodes.append(f"{tag}n{n}")
        _sh("ip", "link", "add", f"{tag}v0", "type", "veth", "peer", "name", f"{tag}v1")
        for n in (0, 1):
            ns, dev = f"{tag}n{n}", f"{tag}v{n}"
            _sh("ip", "link", "set", dev, "netns", ns)
            _sh("ip", "-n", ns, "addr", "add", f"{subnet}.{n + 1}/24", "dev", dev)
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield [(f"{tag}n{n}", f"{tag}v{n}", f"{subnet}.{n + 1}") for n in (0, 1)]
    finally:
        for ns in nodes:  # deleting a namespace deletes its end of the veth pair, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)



def run_on_nodes(nodes: list[tuple[str, str, str]], commands: list[list[str]], env: dict[str, str],
                 cwd: str | os.PathLike, timeout: float) -> list[str]:
    """Run ``commands[n]`` in ``nodes[n]``'s namespace, all at once; their outputs. Fails the test, killing them
    all, when one does not finish within ``timeout`` seconds; and when one exits with an error."""
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, *cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for (ns, _, _), cmd in zip(nodes, commands)]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(f"the nodes did not finish within {timeout:.0f} s:\n"
                        + "\n".join(p.communicate()[0] for p in procs))
    assert [p.returncode for p in procs] == [0] * len(procs), "\n\n".join(o[-4000:] for o in outputs)
    return outputs
