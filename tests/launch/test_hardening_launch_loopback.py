"""A one-node ``turbotrain launch`` listens on the loopback only (issue 43, item 9): its rendezvous store, the
store the ranks meet at, and gloo's sockets are not reachable from other machines."""

from __future__ import annotations

import json

from launch_helpers import launch
from turbotrain.launch.cli import LaunchOptions, torchrun_argv

# Rank 0 lists every listening TCP socket of the launcher (its parent) and of itself, from /proc/net/tcp{,6}.
WORKER = '''import json, os, sys
import torch.distributed as dist

def listening(pids):
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in open(f"/proc/net/{table}").read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1].rpartition(":")[0])
    return found

dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 0:
    out = {"master_addr": os.environ["MASTER_ADDR"], "launcher": listening([os.getppid()]),
           "rank": listening([os.getpid()])}
    open(sys.argv[1], "w").write(json.dumps(out))
dist.barrier()
dist.destroy_process_group()
'''
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def test_one_node_names_the_loopback_as_this_nodes_address():
    argv = torchrun_argv(LaunchOptions(__file__, nproc_per_node="2"))
    assert argv[argv.index("--local-addr") + 1] == "127.0.0.1"
    several = torchrun_argv(LaunchOptions(__file__, nnodes="2", node_rank=0, rdzv_endpoint="10.0.0.1:29400"))
    assert "--local-addr" not in several  # several nodes must reach each other


def test_a_one_node_launch_listens_on_the_loopback_only(tmp_path):
    worker, out = tmp_path / "listens.py", tmp_path / "listening.json"
    worker.write_text(WORKER)
    launch("--nproc-per-node", "2", str(worker), str(out), timeout=120, warm_ranks=False)  # the launcher's children
    seen = json.loads(out.read_text())
    assert seen["master_addr"] == "127.0.0.1"
    assert seen["launcher"], "the launcher hosts the rendezvous store: it must be listening"
    assert set(seen["launcher"]) <= LOOPBACK and set(seen["rank"]) <= LOOPBACK, seen
