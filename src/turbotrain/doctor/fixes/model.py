"""Re-exported for the edit modules: why an edit could not be made (:class:`ByHand`, from :mod:`..edits`) and the
plain data of ``doctor --fix`` (:mod:`turbotrain.doctor.report.fix_results`)."""

from __future__ import annotations

from ..edits import EXACT, PRECISION, REINITIALISED, RESAMPLED, ByHand
from ..report.fix_results import EditRequest

__all__ = ["ByHand", "EditRequest", "EXACT", "PRECISION", "REINITIALISED", "RESAMPLED"]
