"""The non-finite guard: a NaN/inf loss or gradient never reaches a checkpoint, and by default
never reaches the weights either (the exception: stop mode on a GPU without fused optimizers).

Before every optimizer step one fused kernel (the one GradScaler uses) checks the loss and
all gradients. On the CPU the verdict is read right away (no device to wait for). On a GPU
the flag stays on the device and the host reads it only at the logging cadence and before
each checkpoint. Each step's kernel writes its own flag in a window of flags zeroed at each
read, so the step pays for that one kernel alone and the read still names the first bad step:
- every optimizer fused: the flag goes to the fused kernel, which leaves the weights
  untouched, so stop and skip are exact without a sync;
- otherwise, in "stop" mode, the bad update happens, training stops at the next read naming
  the first bad step, and no checkpoint holds that step (the read comes before each save);
- otherwise, in "skip" mode, the verdict is needed before the step: one sync per step,
  said once at the start.
Under fp16-mixed the GradScaler already skips such steps and the guard only reports how
many it skipped.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

import torch

from ..speedups.fused_optimizer import takes_found_inf

__all__ = ["NonFiniteError", "FiniteGuard"]

log = logging.getLogger("turbotrain")

WINDOW = 256
"""Step flags kept between two reads of the verdict at first (the window doubles when reads are rarer)."""


class NonFiniteError(FloatingPointError):
    """Training stopped at a step whose loss or gradients were NaN or infinite."""

    def __init__(self, step: int, where: str = "loss or gradients", *, reached_weights: bool = False):
        self.step = step
        weights = (
            "the weights in memory hold the updates from that step on, no checkpoint does (resume from the last one)"
            if reached_weights
            else "no update from that step reached the weights"
        )
        super().__init__(
            f"non-finite {where} at step {step}; {weights}. "
            "Try a lower learning rate, gradient clipping (gradient_clip_val=1.0), bf16 instead of fp16, or "
            "on_nonfinite='skip' to skip such steps."
        )


def verdict_paths(device_type: str, all_fused: bool, mode: str, scaled: bool) -> tuple[bool, bool, bool]:
    """(read on the host, fused kernels skip on the device, stop deferred to the logging cadence)."""
    on_host = device_type != "cuda"
    on_device_skip = not on_host and all_fused
    # Stop mode on a GPU without fused optimizers: read the flag at the logging cadence, not per step.
    deferred = not on_host and not on_device_skip and not scaled and mode == "stop"
    return on_host, on_device_skip, deferred


class FiniteGuard:
    def __init__(self, optimizers, device: torch.device, mode: str, scaler=None):
        self.mode = mode
        self.scaler = scaler
        self.watch(optimizers)
        all_fused = bool(optimizers) and all(takes_found_inf(opt) for opt in optimizers)
        self.on_host, self.on_device_skip, self.deferred = verdict_paths(
            device.type, all_fused, mode, scaler is not None
        )
        self.one = torch.ones((), device=device)
        self.skipped = 0
        # Distributed runs: makes every rank's flag the largest over ranks (see RankCoordinator).
        self.agree: Callable[[torch.Tensor], None] | None = None
        # Device paths: one flag per step since the last read; ``found`` is the latest step's flag.
        self._window = torch.zeros(WINDOW, device=device)
        self._slots = self._window.unbind()  # views made once: a step's flag costs no host work
        self._window_start: int | None = None  # the step whose flag is slot 0
        self.found = self._slots[0]
        # The scale before any step (no device sync: the scaler has not made its tensor yet), so
        # the GradScaler's skips before the first report are counted too.
        self._last_scale: float | None = float(scaler.get_scale()) if scaler is not None else None
        if scaler is None and not self.on_host and not self.on_device_skip and mode == "skip":
            log.info(
                "turbotrain: on_nonfinite='skip' reads one flag per step on the host (a device sync) "
                "because an optimizer is not fused; fused_optimizer=True keeps it on the device"
            )

    def watch(self, optimizers) -> None:
        """Check these optimizers' parameters (again when a pipeline or FSDP replaced them)."""
        params = [p for opt in optimizers for g in opt.param_groups for p in g["params"]]
        # Gradients share their parameter's dtype: group once here, not on every step.
        dtypes = sorted({p.dtype for p in params}, key=str)
        self.param_groups = [[p for p in params if p.dtype == dt] for dt in dtypes]

    def check(self, loss: torch.Tensor | float | None, step: int) -> bool:
        """Whether this step may update the weights. Raises NonFiniteError in 'stop' mode.

        ``loss`` is a float on the host (already read for logging) or a detached device tensor.
        """
        if self.scaler is not None or self.mode == "ignore":
            return True
        if self.on_host:
            return self._check_on_host(loss, step)
        deferred = self.on_device_skip or self.deferred
        if deferred:
            self.found = self._slot(step)  # zeroed at the last read: the kernel below only ever sets it
        else:
            self.found.zero_()
        for group in self.param_groups:
            grads = [p.grad for p in group if p.grad is not None]
            if isinstance(loss, torch.Tensor) and grads and grads[0].dtype == loss.dtype:
                # The loss rides along in the same kernel (a 0-d loss as it is: a reshape is one more op a step).
                grads.append(loss if loss.dim() == 0 else loss.reshape(()))
                loss = None
            if grads:
                # One kernel over every gradient; with a scale of 1 it only checks.
                torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found, self.one)
        if loss is not None:  # a loss whose dtype no gradient group shares
            bad = (~torch.isfinite(torch.as_tensor(loss))).to(self.found.dtype).reshape(())
            # The flag must stay exactly 1: fused optimizers skip only when found_inf == 1.
            torch.maximum(self.found, bad, out=self.found)
        if self.agree is not None:
            self.agree(self.found)  # a collective on the device: still no host sync
        if deferred:
            return True
        if self.found.item() == 0.0:  # the one sync per step of this path (said once at start)
            return True
        return self._bad(step)

    def _slot(self, step: int) -> torch.Tensor:
        """This step's flag, in a window that doubles (on the device, no sync) when reads are rarer than it is long."""
        if self._window_start is None:
            self._window_start = step
        i = step - self._window_start
        if i >= len(self._slots):
            grown = torch.zeros(max(2 * len(self._slots), i + 1), device=self._window.device)
            grown[: len(self._slots)].copy_(self._window)
            self._window, self._slots = grown, grown.unbind()
        return self._slots[i]

    def _read_window(self) -> tuple[int, int]:
        """(bad steps, the first bad step or -1) since the last read; the window starts over. One sync."""
        if self._window_start is None:
            return 0, -1
        flags = self._window.tolist()  # the logging cadence's one read
        start, self._window_start = self._window_start, None
        bad = [i for i, flag in enumerate(flags) if flag > 0]
        if not bad:
            return 0, -1
        self._window.zero_()
        return len(bad), start + bad[0]

    def _check_on_host(self, loss: torch.Tensor | float | None, step: int) -> bool:
        """CPU path: the loss is already a float, and reading the flag waits for no device."""
        loss_bad = loss is not None and not math.isfinite(loss)
        if loss_bad and self.agree is None:
            return self._bad(step)
        # Distributed: every rank runs the kernel (on FSDP's sharded gradients it is itself a collective).
        for group in self.param_groups:
            grads = [p.grad for p in group if p.grad is not None]
            if grads:
                torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found, self.one)
        if self.agree is not None:
            if loss_bad:
                self.found.fill_(1.0)  # the other ranks must hear of it before this one stops
            self.agree(self.found)
        if self.found.item() == 0.0:
            return True
        self.found.zero_()  # the kernel only ever sets the flag: reset it after a bad step
        return self._bad(step)

    def resume(self, skipped: int) -> None:
        """Continue a resumed run's count, from the loss scale its checkpoint restored."""
        self.skipped = skipped
        # Verdicts of the run that stopped belong to it, not to this one.
        self._window.zero_()
        self._window_start = None
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
        """At the logging cadence and before checkpoints: surface device-side verdicts (and GradScaler skips)."""
        if self.scaler is not None:
            scale = float(self.scaler.get_scale())
            if self._last_scale is not None and scale < self._last_scale:
                # Each non-finite step halves the scale (backoff 0.5): count the halvings.
                self.skipped += max(1, round(math.log2(self._last_scale / scale)))
            self._last_scale = scale
            return self.skipped
        if self.on_device_skip or self.deferred:
            pending, first_bad = self._read_window()
            if pending:
                if self.mode == "stop":
                    raise NonFiniteError(first_bad, reached_weights=self.deferred)
                self.skipped += pending
        return self.skipped
