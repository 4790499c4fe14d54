"""The command prints turbotrain's own log records and leaves the root logger as a plain run of the script has it:
the doctor runs the script in its own process, and Lightning logs each line twice where the root has a handler."""

from __future__ import annotations

import logging

import pytest

from turbotrain import cli

pytestmark = pytest.mark.reads_no_time


class _Command:
    """A stand-in sub-command that logs as the script and turbotrain would while it runs."""

    seen_root: list[logging.Handler] | None = None

    @staticmethod
    def add_arguments(parser) -> None:
        pass

    @classmethod
    def run(cls, args) -> int:
        cls.seen_root = list(logging.getLogger().handlers)
        logging.getLogger("turbotrain.doctor").warning("turbotrain says this")
        logging.getLogger("turbotrain.doctor").info("only with --verbose")
        return 0


@pytest.mark.parametrize("verbose", [False, True])
def test_turbotrain_logs_to_stderr_and_the_root_logger_stays_bare(monkeypatch, capsys, verbose):
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # as in `turbotrain doctor train.py`: nothing configured logging
    monkeypatch.setattr(cli, "_available", lambda: [("fake", _Command, "a stand-in")])
    assert cli.main(["-v", "fake"] if verbose else ["fake"]) == 0
    assert _Command.seen_root == []
    err = capsys.readouterr().err
    assert "turbotrain says this" in err
    assert ("only with --verbose" in err) is verbose
    ours = logging.getLogger("turbotrain")
    assert ours.propagate and ours.level == logging.NOTSET  # as before the command: pytest's caplog still sees it
