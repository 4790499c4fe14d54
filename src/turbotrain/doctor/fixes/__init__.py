"""``doctor --fix`` / ``--verify``: each finding's fix as an edit of the user's own lines, one reviewable
patch, and the patched script timed against the original.

It consumes a finished report; the report never imports it. Modules, one job each: ``choose`` (findings
-> edit requests), ``table`` (edit kind -> LibCST edit: ``keywords``, ``statements``, ``cadence``,
``attention``; ``..cst_tools`` holds what they share with a rule's own rewrite), ``diff`` (unified diffs
with difflib, the compile check, combining fixes), ``verify`` + ``child`` + ``losses`` (interleaved runs of
original and patched, losses compared), ``attach`` (the order of work). What came of it is plain data in
:mod:`turbotrain.doctor.report.fix_results`, shown by :mod:`turbotrain.doctor.report.fix_section`.

Importing this package does not import LibCST; the edits do (``pip install 'turbotrain[fix]'``).
"""

from ..report.fix_results import FixReport, FixResult, Verification
from .model import ByHand, EditRequest

__all__ = ["ByHand", "EditRequest", "FixReport", "FixResult", "Verification", "require_libcst"]


def require_libcst() -> None:
    """Fail early, before the script runs, when the edits could not be made."""
    try:
        import libcst  # noqa: F401 - only whether it imports
    except ImportError as exc:
        from ...config import ConfigError

        raise ConfigError(
            "doctor --fix edits your script with LibCST, which is not installed: "
            "pip install 'turbotrain[fix]' (or pip install libcst)"
        ) from exc
