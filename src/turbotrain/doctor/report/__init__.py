"""Stage 5, the report: its model and JSON (:mod:`.model`), the terminal and HTML views, the tables it shows,
and what came of ``--fix`` (:mod:`.fix_results`, shown by :mod:`.fix_section`)."""

from .model import Report
from .palette import CATEGORY_LABELS

__all__ = ["Report", "CATEGORY_LABELS"]
