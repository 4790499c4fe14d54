"""`make gpu-check` runs on a lent GPU machine in one 10-minute call, where a typo costs device minutes:
its documented CPU dry run (docs/bench.md) runs here, every part, every file it promises under $OUT."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMISED = {"gpu-check.log", "summary.txt", "env.txt", "junit-gpu.xml", "bench.md", "bench.json", "results.tar.gz"}


def _documented_dry_run() -> str:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / "bench.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if "make gpu-check" in b]
    return block


def test_the_documented_dry_run_runs_every_part(tmp_path):
    command = _documented_dry_run()
    out, scratch = tmp_path / "out", tmp_path / "tmp"
    command = re.sub(r"OUT=\S+", f"OUT={out}", command)
    command = command.replace("GPU_CHECK_PYTHON=.venv/bin/python", f"GPU_CHECK_PYTHON={sys.executable}")
    scratch.mkdir()
    proc = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert PROMISED <= {p.name for p in out.iterdir()}, sorted(p.name for p in out.iterdir())
    # Its work dir (wheels, bench and doctor files) is packed into results.tar.gz and then removed.
    assert not list(scratch.glob("gpu-check.*")), sorted(p.name for p in scratch.iterdir())
    summary = (out / "summary.txt").read_text()
    for part in ("setup", "env", "pytest", "bench-gpt", "bench-cnn", "extras", "doctor", "probe"):
        assert re.search(rf"\b{re.escape(part)}\b.*\bok\b", summary), summary
