"""Why an edit could not be made (:class:`ByHand`); the plain data of ``doctor --fix`` (what to edit, what came
of each fix) is :mod:`turbotrain.doctor.report.fix_results`, re-exported here for the edit modules."""

from __future__ import annotations

from ..report.fix_results import EXACT, PRECISION, REINITIALISED, EditRequest

__all__ = ["ByHand", "EditRequest", "EXACT", "PRECISION", "REINITIALISED"]


class ByHand(Exception):
    """An edit that cannot be made safely on the source; the message says why, for the patch header."""
