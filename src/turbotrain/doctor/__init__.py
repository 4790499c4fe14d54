"""The doctor: why a training script is slow, where in its code, and what each fix buys, measured.

* ``turbotrain doctor [--steps N] [--json P] [--html P] [--trace P] train.py --their --args``
* ``with turbotrain.doctor.watch(steps=20): ...`` around a loop (a notebook, or a script kept as is)
* :func:`diagnose_script` from Python.

Modules: ``recorder``/``instrument`` (hooks; step boundaries at the optimizer), ``breakdown``
(time per category), ``overhead`` (python_overhead), ``context`` (what rules see), ``rules``
(runtime / live objects / static source), ``whatif`` (measured fixes), ``report``,
``terminal``, ``html_report``, ``watch``, ``cli``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy

if TYPE_CHECKING:
    from .diagnose import DoctorOptions, analyse, diagnose_script
    from .findings import Finding
    from .report.model import Report
    from .watching import Watch, watch

# Imported on first use: `turbotrain doctor --help` builds its flags without importing torch.
__getattr__, __dir__ = lazy(
    globals(),
    {
        "watch": ".watching",
        "Watch": ".watching",
        "diagnose_script": ".diagnose",
        "DoctorOptions": ".diagnose",
        "analyse": ".diagnose",
        "Report": ".report.model",
        "Finding": ".findings",
    },
)

__all__ = ["watch", "Watch", "diagnose_script", "DoctorOptions", "analyse", "Report", "Finding"]
