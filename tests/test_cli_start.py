"""The command answers `--help`, a mistyped flag and a missing script without importing torch (3-4 s on a small
CPU), and the package's names, imported on first use, are the objects their modules define."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_help_and_a_bad_flag_import_no_torch():
    code = (
        "import sys\n"
        "from turbotrain.cli import main\n"
        "for argv in (['--help'], ['doctor', '--help'], ['bench', '--help'], ['doctor', '--steps', 'x', 'a.py'],\n"
        "             ['doctor'], ['doctor', 'missing.py'], ['doctor', '--fix', '.', 'missing.py']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('torch imported' if 'torch' in sys.modules else 'no torch')\n"
    )
    proc = _fresh(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("no torch"), proc.stdout[-500:]
    assert "usage: turbotrain doctor" in proc.stdout and "--steps: invalid" in proc.stderr, proc.stderr[-500:]
    assert "doctor: no script given" in proc.stderr and "doctor: no such script: missing.py" in proc.stderr


def test_the_lazy_names_are_the_modules_objects():
    code = (
        "import turbotrain as tt, sys\n"
        "assert 'torch' not in sys.modules\n"
        "from turbotrain.own_loop import setup\n"
        "from turbotrain.plan import Plan\n"
        "from turbotrain.tuning.api import tune\n"
        "from turbotrain.doctor.watching import watch\n"
        "assert tt.setup is setup and tt.Plan is Plan and tt.tune is tune and tt.doctor.watch is watch\n"
        "assert tt.data.FileDataset.__module__ == 'turbotrain.data.files'\n"
        "assert set(tt.__all__) <= set(dir(tt))\n"
        "print('ok')\n"
    )
    proc = _fresh(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_a_name_the_package_does_not_have_is_an_attribute_error():
    import turbotrain as tt

    with pytest.raises(AttributeError, match="'turbotrain' has no attribute 'Plann'"):
        tt.Plann  # noqa: B018 - the lookup is what is tested
