"""Two nodes on one machine (tests/namespaces.py), one `turbotrain launch` in each: node 0 hosts the c10d
rendezvous, node 1 joins it, gloo connects the ranks over the veth link."""

from __future__ import annotations

import sys

import pytest

from launch_helpers import ROOT, WORKER, assert_same_weights, cli_env, read_rank
from namespaces import run_on_nodes, two_network_nodes


@pytest.fixture
def two_nodes():
    with two_network_nodes() as nodes:
        yield nodes


def test_two_nodes_rendezvous_over_their_network_and_train_like_one_process(two_nodes, tmp_path,
                                                                            single_process_reference):
    endpoint = f"{two_nodes[0][2]}:29400"
    commands = [[sys.executable, "-m", "turbotrain", "launch", "--nnodes", "2", "--node-rank", str(node_rank),
                 "--rdzv-endpoint", endpoint, "--local-addr", addr,
                 "--nccl-socket-ifname", dev,  # also sets GLOO_SOCKET_IFNAME: gloo talks over the veth link
                 "--nproc-per-node", "1", str(WORKER), "--out", str(tmp_path), "--config", "plain"]
                for node_rank, (_, dev, addr) in enumerate(two_nodes)]
    run_on_nodes(two_nodes, commands, env=cli_env(), cwd=ROOT, timeout=180)
    ranks = [read_rank(tmp_path, "plain", r) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert_same_weights(ranks[0]["weights"], ranks[1]["weights"], exact=True)
    assert_same_weights(ranks[0]["weights"], single_process_reference["weights"])
