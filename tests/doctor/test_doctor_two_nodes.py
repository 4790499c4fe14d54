"""The doctor on a job over two nodes (two network namespaces, tests/namespaces.py): one
``turbotrain doctor -- turbotrain launch --nnodes 2 ...`` per node, as a user runs it on each host. The ranks meet
only over the veth link, and each node's doctor still reports every rank of the job, with the straggler on the
other node named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from doctor_helpers import JOB_FAST, ROOT, job_env, job_processes
from namespaces import two_network_nodes

SCRIPT = Path(__file__).parent / "scripts" / "ddp_straggler_data.py"


@pytest.fixture
def two_nodes():
    with two_network_nodes() as nodes:
        yield nodes


def test_each_node_reports_every_rank_and_the_straggler_on_the_other_node(two_nodes, tmp_path):
    endpoint = f"{two_nodes[0][2]}:29400"
    procs = []
    for node, (ns, dev, addr) in enumerate(two_nodes):
        launcher = [sys.executable, "-m", "turbotrain", "launch", "--nnodes", "2", "--node-rank", str(node),
                    "--rdzv-endpoint", endpoint, "--local-addr", addr,
                    "--nccl-socket-ifname", dev,  # also sets GLOO_SOCKET_IFNAME: gloo talks over the veth link
                    "--nproc-per-node", "1", str(SCRIPT), "--slow-rank", "1"]
        doctor = ["ip", "netns", "exec", ns, sys.executable, "-m", "turbotrain", "doctor", *JOB_FAST,
                  "--json", str(tmp_path / f"node{node}.json"), "--", *launcher]
        procs.append(subprocess.Popen(doctor, cwd=ROOT, env=job_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("the two doctors did not finish within 240 s:\n" + "\n".join(p.communicate()[0] for p in procs))
    assert [p.returncode for p in procs] == [0, 0], "\n\n".join(o[-4000:] for o in outputs)
    for node in (0, 1):
        report = json.loads((tmp_path / f"node{node}.json").read_text())
        assert sorted(r["rank"] for r in report["ranks"]) == [0, 1], (node, report["ranks"])
        straggler = report["straggler"]
        assert straggler is not None and (straggler["rank"], straggler["cause"]) == (1, "data_loading"), (
            node, report["ranks"])
        assert any("spans 2 nodes" in m for m in report["messages"]), report["messages"]
    assert job_processes(str(SCRIPT)) == []
