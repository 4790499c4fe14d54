"""`turbotrain launch` option handling: what torchrun is asked to do, and refusals that say how to fix."""

from __future__ import annotations

import json

import pytest

from launch_helpers import WORKER, run_launch
from turbotrain.config import ConfigError
from turbotrain.launch.cli import LaunchOptions, torchrun_argv
from turbotrain.launch.nccl import NcclSettings, check_environment, parse_size

SCRIPT = str(WORKER)


def test_one_node_uses_a_private_rendezvous():
    argv = torchrun_argv(LaunchOptions(SCRIPT, ("--lr", "3"), nproc_per_node="2", max_restarts=2))
    assert argv[:4] == ["--nproc-per-node", "2", "--standalone", "--nnodes"]
    assert argv[argv.index("--max-restarts") + 1] == "2"
    assert argv[-3:] == [SCRIPT, "--lr", "3"]  # the script's own arguments stay last, untouched


@pytest.mark.parametrize("node_rank, is_host", [(0, "true"), (1, "false")])
def test_node_rank_zero_hosts_the_c10d_rendezvous(node_rank, is_host):
    argv = torchrun_argv(LaunchOptions(SCRIPT, nnodes="2", node_rank=node_rank, rdzv_endpoint="10.0.0.1:29400"))
    assert "--standalone" not in argv
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert argv[argv.index("--rdzv-conf") + 1] == f"is_host={is_host}"


def test_static_rendezvous_passes_the_node_rank():
    argv = torchrun_argv(LaunchOptions(SCRIPT, nnodes="2", node_rank=1, rdzv_endpoint="h:1234", rdzv_backend="static"))
    assert argv[argv.index("--node-rank") + 1] == "1"


@pytest.mark.parametrize("changes, words", [
    ({"nnodes": "2"}, "--rdzv-endpoint"),
    ({"nnodes": "2", "rdzv_endpoint": "host"}, "host:port"),
    ({"nnodes": "2", "rdzv_endpoint": "h:1", "node_rank": 2}, "0..1"),
    ({"nproc_per_node": "0"}, "--nproc-per-node"),
    ({"nnodes": "3:1"}, "MIN:MAX"),
    ({"max_restarts": -1}, ">= 0"),
    ({"script": "no/such/train.py"}, "does not exist"),
])
def test_bad_options_are_refused_with_the_fix(changes, words):
    opts = LaunchOptions(**{"script": SCRIPT, **changes})
    with pytest.raises(ConfigError, match=words.replace(".", r"\.").replace("(", r"\(")):
        torchrun_argv(opts)


def test_nccl_settings_become_environment_variables():
    env = NcclSettings(algo="ring,tree", proto="^LL128", buffsize=parse_size("8MiB"), socket_ifname="eth1",
                       ib_disable=True, extra=("NCCL_MIN_NCHANNELS=4",)).to_env()
    assert env == {"NCCL_ALGO": "ring,tree", "NCCL_PROTO": "^LL128", "NCCL_BUFFSIZE": str(8 * 2**20),
                   "NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1", "NCCL_IB_DISABLE": "1",
                   "NCCL_MIN_NCHANNELS": "4"}
    assert NcclSettings(algo="allreduce:tree;broadcast:ring").to_env()["NCCL_ALGO"] == "allreduce:tree;broadcast:ring"


@pytest.mark.parametrize("kwargs, words", [
    ({"algo": "rings"}, "unknown value 'rings'"),
    ({"algo": "gather:ring"}, "unknown collective"),
    ({"proto": "LL256"}, "unknown value 'LL256'"),
    ({"buffsize": 0}, "positive"),
    ({"extra": ("FOO=1",)}, "NCCL_NAME=value"),
])
def test_bad_nccl_settings_are_refused(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        NcclSettings(**kwargs)


def test_sizes_parse_in_binary_units():
    assert parse_size("4194304") == parse_size("4M") == parse_size("4MiB") == parse_size("4096k") == 4 * 2**20
    with pytest.raises(ConfigError, match="not a size"):
        parse_size("four megs")


def test_inherited_nccl_environment_is_checked():
    problems = check_environment({"NCCL_ALGO": "Rnig", "NCCL_DEBUG": "INFO", "NCCL_BUFFSIZE": "2M"})
    assert len(problems) == 2
    assert "Rnig" in problems[0] and "slows training" in problems[1]
    assert check_environment({"NCCL_ALGO": "Tree", "NCCL_DEBUG": "WARN"}) == []


def test_dry_run_prints_the_torchrun_command():
    proc = run_launch("--nproc-per-node", "2", "--nccl-algo", "Tree", "--nccl-buffsize", "16M", "--dry-run", SCRIPT,
                      "--max-restarts", "9", timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith(f"NCCL_ALGO=Tree NCCL_BUFFSIZE={16 * 2**20} torchrun --nproc-per-node 2 --standalone")
    # options after the script belong to the script, even when they look like launch options
    assert line.endswith(f"--max-restarts 0 {SCRIPT} --max-restarts 9")


def test_a_failing_script_fails_the_launch(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys; sys.exit(3)\n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    # Ranks the launcher starts itself: torchrun's summary names the binary it ran, a warm rank's client otherwise.
    proc = run_launch(str(script), timeout=120, warm_ranks=False, TMPDIR=str(temp))
    assert proc.returncode == 1
    assert "fails.py FAILED" in proc.stderr and "exitcode  : 3" in proc.stderr
    # torchrun's per-launch log folder is not left behind (it held no file: no rank recorded an error).
    assert list(temp.glob("torchelastic_*")) == []


ECHO_ARGS = """import json, os, sys
from pathlib import Path
Path(os.environ["ECHO_OUT"]).write_text(json.dumps(sys.argv[1:]))
"""


@pytest.mark.parametrize("script_args", [
    ["--log", "5"],                      # a prefix of torchrun's --log-dir, --log-line-prefix-template, ...
    ["--d", "5"],                        # of launch's --dry-run and torchrun's --daemon... options
    ["--rdzv", "x"],                     # of --rdzv-endpoint, --rdzv-backend, --rdzv-id, --rdzv-conf
    ["--", "--d", "5"],                  # a `--` after the script is the script's too
    ["--n", "3", "--nproc-per-node", "7", "-h"],
], ids=lambda a: " ".join(a))
def test_everything_after_the_script_reaches_it_untouched(tmp_path, script_args):
    script = tmp_path / "echo_args.py"
    script.write_text(ECHO_ARGS)
    out = tmp_path / "argv.json"
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = run_launch("--nproc-per-node", "1", str(script), *script_args, timeout=120, ECHO_OUT=str(out),
                      TMPDIR=str(temp))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == script_args
    assert list(temp.glob("torchelastic_*")) == []  # torchrun's per-launch log folder is not left behind


def test_a_double_dash_before_the_script_only_ends_launch_options():
    proc = run_launch("--dry-run", "--", SCRIPT, "--", "--d", "5", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(f"--max-restarts 0 {SCRIPT} -- --d 5")
