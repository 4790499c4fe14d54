"""The non-finite guard: a NaN/inf loss or gradient never reaches the weights.

Before every optimizer step one fused kernel (the one GradScaler uses) checks the loss and
all gradients. On the CPU the verdict is read right away (no device to wait for). On a GPU
it stays on the device when every optimizer is fused: the flag goes to the fused kernel,
which then leaves the weights untouched, and the host reads it only at the logging cadence.
Other optimizers on a GPU need the verdict on the host, one sync per step; the guard says
so once. Under fp16-mixed the GradScaler already skips such steps and the guard only
reports how many it skipped.
"""

from __future__ import annotations

import logging
import math

import torch

__all__ = ["NonFiniteError", "FiniteGuard"]

log = logging.getLogger("turbotrain")


class NonFiniteError(FloatingPointError):
    """Training stopped at a step whose loss or gradients were NaN or infinite."""

    def __init__(self, step: int, where: str = "loss or gradients"):
        self.step = step
        super().__init__(
            f"non-finite {where} at step {step}; no update from that step reached the weights. "
            "Try a lower learning rate, gradient clipping (gradient_clip_val=1.0), bf16 instead of fp16, or "
            "on_nonfinite='skip' to skip such steps.")


class FiniteGuard:
    def __init__(self, optimizers, device: torch.device, mode: str, scaler=None):
        self.mode = mode
        self.scaler = scaler
        params = [p for opt in optimizers for g in opt.param_groups for p in g["params"]]
        # Gradients share their parameter's dtype: group once here, not on every step.
        dtypes = sorted({p.dtype for p in params}, key=str)
        self.param_groups = [[p for p in params if p.dtype == dt] for dt in dtypes]
        self.on_host = device.type != "cuda"
        self.on_device_skip = (not self.on_host and bool(optimizers) and all(
            getattr(opt, "_step_supports_amp_scaling", False) for opt in optimizers))
        self.found = torch.zeros((), device=device)
        self.one = torch.ones((), device=device)
        self.skipped = 0
        self._pending = torch.zeros((), device=device)          # device-skipped steps not yet reported
        self._first_bad = torch.full((), -1, dtype=torch.long, device=device)
        # The scale before any step (no device sync: the scaler has not made its tensor yet), so
        # the GradScaler's skips before the first report are counted too.
        self._last_scale: float | None = float(scaler.get_scale()) if scaler is not None else None
        if scaler is None and not self.on_host and not self.on_device_skip:
            log.info("turbotrain: the non-finite guard reads one flag per step on the host (a device sync) "
                     "because an optimizer is not fused; fused_optimizer=True keeps it on the device")

    def check(self, loss: torch.Tensor | float | None, step: int) -> bool:
        """Whether this step may update the weights. Raises NonFiniteError in 'stop' mode.

        ``loss`` is a float on the host path (already read for logging) or a device tensor.
        """
        if self.scaler is not None:
            return True
        if self.on_host and loss is not None and not math.isfinite(loss):
            return self._bad(step)
        self.found.zero_()
        for group in self.param_groups:
            grads = [p.grad for p in group if p.grad is not None]
            if not self.on_host and loss is not None and grads and grads[0].dtype == loss.dtype:
                grads.append(loss.reshape(()))
                loss = None
            if grads:
                # One kernel over every gradient; with a scale of 1 it only checks.
                torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found, self.one)
        if loss is not None and not self.on_host:
            self.found.add_((~torch.isfinite(loss)).to(self.found.dtype).reshape(()))
        if self.on_device_skip:
            self._pending.add_(self.found)
            self._first_bad = torch.where((self._first_bad < 0) & (self.found > 0),
                                          torch.full_like(self._first_bad, step), self._first_bad)
            return True
        if self.found.item() == 0.0:  # on the CPU this is a plain read, not a device sync
            return True
        return self._bad(step)

    def resume(self, skipped: int) -> None:
        """Continue a resumed run's count, from the loss scale its checkpoint restored."""
        self.skipped = skipped
        if self.scaler is not None:
            self._last_scale = float(self.scaler.get_scale())

    def _bad(self, step: int) -> bool:
        if self.mode == "stop":
            raise NonFiniteError(step)
        self.skipped += 1
        return False

    def arm(self, optimizers) -> None:
        """Hand the verdict to fused optimizers (they skip the update on the device)."""
        if self.on_device_skip and self.scaler is None:
            for opt in optimizers:
                opt.found_inf = self.found

    def disarm(self, optimizers) -> None:
        if self.on_device_skip and self.scaler is None:
            for opt in optimizers:
                opt.__dict__.pop("found_inf", None)

    def report(self) -> int:
        """At the logging cadence: surface device-side skips (and GradScaler skips)."""
        if self.scaler is not None:
            scale = float(self.scaler.get_scale())
            if self._last_scale is not None and scale < self._last_scale:
                # Each non-finite step halves the scale (backoff 0.5): count the halvings.
                self.skipped += max(1, round(math.log2(self._last_scale / scale)))
            self._last_scale = scale
            return self.skipped
        if self.on_device_skip:
            pending = int(self._pending.item())  # the logging cadence's one read
            if pending:
                if self.mode == "stop":
                    raise NonFiniteError(int(self._first_bad.item()))
                self.skipped += pending
                self._pending.zero_()
                self._first_bad.fill_(-1)
        return self.skipped
