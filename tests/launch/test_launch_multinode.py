"""Two nodes on one machine: two network namespaces joined by a veth pair, one `turbotrain launch` in each.

Each namespace has its own network stack (its own interfaces, addresses and ports), so the two
launches can only meet over the veth link, exactly like two hosts on a network: node 0
(10.77.x.1) hosts the c10d rendezvous, node 1 (10.77.x.2) joins it, gloo connects the ranks
over the link. Needs root and iproute2 (`scripts/ci-deps.sh` installs it); skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from launch_helpers import ROOT, WORKER, assert_same_weights, cli_env, read_rank


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


@pytest.fixture
def two_nodes():
    """Namespaces tt<pid>n0/n1 with addresses 10.77.<k>.1 and .2 on a veth pair; removed afterwards."""
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


def test_two_nodes_rendezvous_over_their_network_and_train_like_one_process(two_nodes, tmp_path,
                                                                            single_process_reference):
    endpoint = f"{two_nodes[0][2]}:29400"
    procs = []
    for node_rank, (ns, dev, addr) in enumerate(two_nodes):
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "turbotrain", "launch", "--nnodes", "2",
               "--node-rank", str(node_rank), "--rdzv-endpoint", endpoint, "--local-addr", addr,
               "--nccl-socket-ifname", dev,  # also sets GLOO_SOCKET_IFNAME: gloo talks over the veth link
               "--nproc-per-node", "1", str(WORKER), "--out", str(tmp_path), "--config", "plain"]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("the two nodes did not finish within 180 s:\n" + "\n".join(p.communicate()[0] for p in procs))
    assert [p.returncode for p in procs] == [0, 0], "\n\n".join(o[-4000:] for o in outputs)
    ranks = [read_rank(tmp_path, "plain", r) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert_same_weights(ranks[0]["weights"], ranks[1]["weights"], exact=True)
    assert_same_weights(ranks[0]["weights"], single_process_reference["weights"])
