"""The doctor on a job over two nodes (two network namespaces, tests/namespaces.py): one
``turbotrain doctor -- turbotrain launch --nnodes 2 ...`` per node, as a user runs it on each host. The ranks meet
only over the veth link, and each node's doctor still reports every rank of the job, with the straggler on the
other node named."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from doctor_helpers import JOB_FAST, ROOT, job_env, job_processes
from namespaces import run_on_nodes, two_network_nodes

SCRIPT = Path(__file__).parent / "scripts" / "ddp_straggler_data.py"


@pytest.fixture
def two_nodes():
    with two_network_nodes() as nodes:
        yield nodes


def test_each_node_reports_every_rank_and_the_straggler_on_the_other_node(two_nodes, tmp_path):
    endpoint = f"{two_nodes[0][2]}:29400"
    commands = []
    for node, (_, dev, addr) in enumerate(two_nodes):
        launcher = [sys.executable, "-m", "turbotrain", "launch", "--nnodes", "2", "--node-rank", str(node),
                    "--rdzv-endpoint", endpoint, "--local-addr", addr,
                    "--nccl-socket-ifname", dev,  # also sets GLOO_SOCKET_IFNAME: gloo talks over the veth link
                    "--nproc-per-node", "1", str(SCRIPT), "--slow-rank", "1"]
        commands.append([sys.executable, "-m", "turbotrain", "doctor", *JOB_FAST,
                         "--json", str(tmp_path / f"node{node}.json"), "--", *launcher])
    run_on_nodes(two_nodes, commands, env=job_env(), cwd=ROOT, timeout=240)
    for node in (0, 1):
        report = json.loads((tmp_path / f"node{node}.json").read_text())
        assert sorted(r["rank"] for r in report["ranks"]) == [0, 1], (node, report["ranks"])
        straggler = report["straggler"]
        assert straggler is not None and (straggler["rank"], straggler["cause"]) == (1, "data_loading"), (
            node, report["ranks"])
        assert any("spans 2 nodes" in m for m in report["messages"]), report["messages"]
    assert job_processes(str(SCRIPT)) == []
