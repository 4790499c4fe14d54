"""Two nodes on one machine (tests/namespaces.py), one `turbotrain launch` in each: node 0 hosts the c10d
rendezvous, node 1 joins it, gloo connects the ranks over the veth link."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launch_helpers import ROOT, WORKER, assert_same_weights, cli_env, read_rank
from namespaces import two_network_nodes


@pytest.fixture
def two_nodes():
    with two_network_nodes() as nodes:
        yield nodes


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
