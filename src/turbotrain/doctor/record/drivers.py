"""Which framework drove the training loop: read from the call stack of the first optimizer step.

A script's imports say what it could use; the frames around ``optimizer.step()`` say what ran. A Lightning
``Trainer`` steps the optimizer from ``lightning.pytorch``, Fabric from ``lightning.fabric`` (its wrapped
optimizer), Accelerate from ``accelerate`` (``AcceleratedOptimizer``) and a Hugging Face ``Trainer`` from
``transformers.trainer`` (through Accelerate's wrapper: the outermost framework on the stack is the one whose
loop it is). No framework frame on the stack: the loop is plain PyTorch.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType

__all__ = ["StepDriver", "DRIVERS", "driver_of"]

# Module-name prefixes of the frameworks whose loops call optimizer.step(), and the name the doctor gives each.
DRIVERS: tuple[tuple[str, str], ...] = (
    ("transformers.trainer", "hf_trainer"),
    ("lightning.pytorch", "lightning"),
    ("pytorch_lightning", "lightning"),
    ("lightning.fabric", "fabric"),
    ("lightning_fabric", "fabric"),
    ("accelerate", "accelerate"),
)


def driver_of(frame: FrameType | None) -> str:
    """The outermost known framework among ``frame`` and its callers, or ``pytorch``."""
    found = "pytorch"
    while frame is not None:
        module = frame.f_globals.get("__name__")
        if isinstance(module, str):
            for prefix, name in DRIVERS:
                if module == prefix or module.startswith(prefix + "."):
                    found = name
                    break
        frame = frame.f_back
    return found


class StepDriver:
    """An optimizer pre-step hook that names the framework at the first step of the script's thread."""

    def __init__(self) -> None:
        self.name = ""  # "" until an optimizer stepped
        self.thread = threading.get_ident()

    def before_step(self, optimizer: object, args: object = None, kwargs: object = None) -> None:
        if self.name or threading.get_ident() != self.thread:
            return
        self.name = driver_of(sys._getframe(1))
