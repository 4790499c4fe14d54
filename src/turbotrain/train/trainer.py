"""The Trainer: a Plan applied, a short hot loop, stopping rules, validation, exact resume.

The per-step path is ``_run_epoch`` -> ``_train_micro_batch`` -> ``_finish_step`` ->
``_step_boundary``, in that order below. It makes no host-device synchronization: losses stay
on the device (on the CPU reading them is free) and are read every ``log_every_n_steps``, as is
the non-finite guard's verdict (the one exception: ``on_nonfinite="skip"`` with unfused
optimizers on a GPU, see nonfinite.py). Everything else (logging, validation, checkpoints,
stopping) is decided by integer comparisons at step boundaries.

What lasts across ``fit`` calls is ``self.state`` (a ``TrainState``, the part checkpoints hold);
what one ``fit`` call creates is ``self.fit_state`` (a ``FitState``); both are in state.py.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .. import distributed as tdist
from ..config import ConfigError
from ..data.transfer import batch_size_of
from ..launch.coordinators import coordinator_for
from ..plan import Plan
from ..runtime import Runtime, prepare
from ..speedups.set_to_none import zero_grad
from .config import TrainerConfig
from .context import StepContext
from .early_stopping import EarlyStopping
from .nonfinite import FiniteGuard
from .preemption import Preempted
from .resumable import EpochSource, Position
from .state import FitResult, FitState, TrainState
from .trainer_checkpoints import TrainerCheckpoints

__all__ = ["Trainer", "FitResult"]


class Trainer:
    """Train ``model`` with ``optimizer`` (or a list of them) under a Plan.

    ``loss_fn(outputs, targets)`` is used for ``(inputs, targets)`` batches; ``step_fn(ctx, batch)``
    replaces the whole step for anything else (see :class:`StepContext`). Limits and cadences
    are keyword arguments (``max_epochs``, ``max_steps``, ``max_time``, ``val_check_interval``,
    ``checkpoint_dir``, ... see :class:`TrainerConfig`); an unknown one is an error.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer,
        loss_fn: Callable | None = None,
        plan: Plan | None = None,
        *,
        step_fn: Callable | None = None,
        val_step_fn: Callable | None = None,
        schedulers=None,
        early_stopping: EarlyStopping | None = None,
        callbacks: Iterable = (),
        split_points: list[str] | None = None,
        **limits: Any,
    ):
        try:
            self.config = TrainerConfig(**limits)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("TrainerConfig", "Trainer")) from None
        if loss_fn is None and step_fn is None:
            raise ConfigError(
                "Trainer: give loss_fn(outputs, targets) for (inputs, targets) batches, "
                "or step_fn(ctx, batch) for anything else."
            )
        if self.config.manual_optimization and step_fn is None:
            raise ConfigError(
                "Trainer: manual_optimization=True runs step_fn(ctx, batch), which steps the "
                "optimizers itself; give step_fn."
            )
        if plan is not None and not isinstance(plan, Plan):
            raise ConfigError(f"Trainer: plan must be a turbotrain.Plan, got {type(plan).__name__}.")
        self.plan = plan or Plan()
        self.loss_fn = loss_fn
        self.step_fn = step_fn
        self.val_step_fn = val_step_fn
        self.early_stopping = early_stopping
        self.callbacks = list(callbacks)
        self.schedulers = (
            [] if schedulers is None else (list(schedulers) if isinstance(schedulers, (list, tuple)) else [schedulers])
        )
        self.state = TrainState()
        self.fit_state: FitState | None = None  # the running (or last) fit() call's
        self.rt: Runtime = prepare(model, optimizer, self.plan)
        self._run_loss = self.rt.wrap_loss(loss_fn)  # compiled beside the model where the plan says so
        self.ctx = StepContext(self, self.rt)
        self.guard = FiniteGuard(self.rt.optimizers, self.rt.device, self.config.on_nonfinite, self.rt.scaler)
        # Chosen once, so the per-step path makes no call it does not need.
        self._manual = self.config.manual_optimization
        self._host = self.rt.device.type != "cuda"  # losses read as floats: no device to wait for
        self._no_contexts = self.rt.ddp is None and self.rt.autocast_dtype is None and self.rt.scaler is None
        needs_wrapper = self.config.gradient_clip_val is not None or self.guard.on_device_skip
        self._step_one = self._step_optimizer if needs_wrapper else self.rt.optimizer_step
        self._per_step_schedulers = bool(self.schedulers) and self.config.scheduler_interval == "step"
        self.is_rank_zero = tdist.is_rank_zero()
        self.ranks = coordinator_for(self.rt)  # distributed: sharding, reductions, checkpoints
        self.pipeline = self.rt.pipeline  # strategy='pipeline': its schedule runs each batch (launch/pipeline.py)
        if self.pipeline is not None:
            self.pipeline.configure(loss_fn if step_fn is None else None, split_points)
            self.pipeline.after_build.append(lambda: self.guard.watch(self.rt.optimizers))
        elif split_points is not None:
            raise ConfigError("Trainer: split_points cut a pipeline; set Plan(strategy='pipeline').")
        if self.ranks.world > 1:
            self.guard.agree = self.ranks.agree_on_flag  # distributed: one verdict for every rank
        self.checkpoints = TrainerCheckpoints(
            self.rt, self.ranks, self.plan, self.schedulers, early_stopping, self.config
        )

    # -- public -----------------------------------------------------------------------------

    @property
    def model(self) -> nn.Module:
        """The user's module (with the plan's in-place changes), for state_dict and inference."""
        return self.rt.module

    def fit(self, train_loader: Iterable, val_loader: Iterable | None = None, *, resume: bool = False) -> FitResult:
        """Train until a limit (steps, epochs, time, early stopping, preemption) or the end of the data."""
        train_loader, val_loader = self.ranks.shard_loader(train_loader), self.ranks.shard_loader(val_loader)
        source = EpochSource(train_loader, self.rt.rebuild_loader)
        val_loader = self.rt.rebuild_loader(val_loader) if val_loader is not None else None
        position = self._resume(source) if resume else None
        run = self.fit_state = FitState.start(
            self.config, self.state, source, val_loader, self.rt.device, self.rt.accum_steps, self.is_rank_zero
        )
        run.next_event = self._next_event_after(self.state.step, run)
        # A CUDA graph's outputs are overwritten by its next replay: losses from one are summed at once.
        run.loss_meter.hold = self.rt.plan.compile_mode not in ("reduce-overhead", "max-autotune")
        self.rt.module.train()
        try:
            try:
                run.signals.__enter__()
                self._train(run, position)
            except RuntimeError as exc:  # outside the per-batch loop: costs nothing per step
                # PyTorch's SIGCHLD handler raises wherever the loop is: say "after N steps".
                clearer = source.worker_death(
                    exc, f"after {self.state.step} optimizer steps (epoch {self.state.epoch})"
                )
                if clearer is None:
                    raise
                raise clearer from exc
            finally:
                run.signals.__exit__()
                now = time.monotonic()
                self.state.elapsed_s += now - run.started
                run.started = now  # later checkpoints add nothing twice
                run.progress.close()
            self._log_metrics()
            if self.config.checkpoint_dir and self.state.step != self.checkpoints.last_step:
                self._save_checkpoint(at_epoch_end=self.state.batches_done == 0)
        finally:
            source.close()  # after the last checkpoint, which records whether workers persist
            for logger in run.loggers:
                logger.close()
        if run.stop_reason == "preempted":
            raise Preempted(self.state.step, self.checkpoints.last_path)
        result = self._result()
        self._callback("on_fit_end", result)
        return result

    @torch.no_grad()
    def validate(self, val_loader: Iterable | None = None) -> dict[str, float]:
        """Mean validation loss under ``torch.inference_mode()``; one host read at the end."""
        run = self.fit_state
        if val_loader is not None:
            loader = self.ranks.shard_loader(val_loader)
        else:
            loader = run.val_loader if run is not None else None
        if loader is None:
            raise ValueError("validate(): no validation loader given to fit() or validate().")
        started = time.monotonic()
        module, rt, limit = self.rt.module, self.rt, self.config.limit_val_batches
        module.eval()
        total = torch.zeros((), device=rt.device, dtype=torch.float64)
        count = 0
        with torch.inference_mode():
            for i, batch in enumerate(rt.device_batches(loader)):
                if limit is not None and i >= limit:
                    break
                if self.pipeline is not None:  # the schedule's eval; no samples off the last stage
                    loss, n = self.pipeline.eval_step(batch)
                    total += loss.detach().double() * n
                    count += n
                    continue
                n = batch_size_of(batch)
                with rt.autocast():
                    loss = self._val_loss(batch)
                total += loss.detach().double() * n
                count += n
        module.train()
        total, count = self.ranks.sum_validation(total, count)  # distributed: every rank's shard
        metrics = {"val_loss": float(total.item()) / max(count, 1)}  # one read per validation
        if run is not None:
            run.clock.exclude(time.monotonic() - started)
        self._callback("on_validation_end", metrics)
        return metrics

    def state_dict(self, at_epoch_end: bool) -> dict[str, Any]:
        """The checkpoint of this moment of ``fit`` (see trainer_checkpoints.py for what it holds)."""
        run = self._run
        elapsed_s = self.state.elapsed_s + time.monotonic() - run.started
        return self.checkpoints.state_dict(self.state, run.source, elapsed_s, at_epoch_end)

    @property
    def _run(self) -> FitState:
        """The running fit() call's state, for the rare events that run inside fit() (the per-step path is
        handed it instead: no check per step)."""
        run = self.fit_state
        if run is None:
            raise RuntimeError("Trainer: this runs inside fit() only (no fit() has started)")
        return run

    # -- the hot loop -----------------------------------------------------------------------

    def _train(self, run: FitState, position: Position | None) -> None:
        """Epochs until a limit stops training; ``position``: where a resumed first epoch starts."""
        run.stop_reason = self._limits_reached()
        while run.stop_reason is None:
            batches = self.rt.device_batches(run.source.epoch(self.state.epoch, position))
            position = None  # the next epochs start at their beginning
            if self._run_epoch(run, batches):
                break
            if self.state.batches_done == 0:  # an epoch without a batch: max_steps would never be reached
                raise run.source.no_batches(self.state.epoch)
            self._end_epoch()

    def _run_epoch(self, run: FitState, batches: Iterable) -> bool:
        """Train one epoch (or what is left of it). True when a limit stopped training."""
        accum, total = self.rt.accum_steps, run.epoch_len
        micro = self.state.batches_done
        step_loss = None
        for batch in batches:
            last = (micro + 1) % accum == 0 or micro + 1 == total
            loss = self._train_micro_batch(batch, last)
            self.state.samples += batch_size_of(batch)
            micro += 1
            step_loss = loss if step_loss is None else step_loss + loss
            if last:
                self.state.batches_done = micro
                if self._finish_step(run, step_loss / accum if accum > 1 else step_loss):
                    return True
                step_loss = None
        if step_loss is not None:  # a loader without a length ended inside an accumulation window
            self.state.batches_done = micro
            if self._finish_step(run, step_loss / (micro % accum)):
                return True
        self.state.batches_done = micro
        return False

    def _train_micro_batch(self, batch: Any, last: bool) -> Any:
        """Forward and backward of one micro-batch; its loss as a float (host) or detached tensor (GPU)."""
        rt, ctx = self.rt, self.ctx
        if self.pipeline is not None:  # one batch is one optimizer step: the schedule splits it
            return self.pipeline.train_step(batch)
        ctx.is_last_micro_batch = last
        if self._manual:
            loss = _loss_of(self.step_fn(ctx, batch))  # type: ignore[misc]  # __init__: manual needs step_fn
        elif self._no_contexts:  # fp32, one process, no scaler: nothing to enter, which tiny steps notice
            loss = self._loss(batch)
            (loss / rt.accum_steps if rt.accum_steps > 1 else loss).backward()
        else:
            with rt.no_sync(not last), rt.autocast():
                loss = self._loss(batch)
                rt.backward(loss / rt.accum_steps if rt.accum_steps > 1 else loss)
        # On the host reading the loss waits for nothing; on a GPU it stays there until logged.
        return loss.item() if self._host else loss.detach()

    def _loss(self, batch: Any) -> torch.Tensor:
        if self.step_fn is not None:
            return _loss_of(self.step_fn(self.ctx, batch))
        try:
            inputs, targets = batch
        except (TypeError, ValueError):
            raise TypeError(
                f"the default step expects (inputs, targets) batches, got {type(batch).__name__}; "
                "pass step_fn=lambda ctx, batch: loss to handle other batches."
            ) from None
        return self._run_loss(self.rt.model(inputs), targets)  # type: ignore[misc]  # __init__: one of the two

    def _finish_step(self, run: FitState, loss: Any) -> bool:
        """Optimizer step(s) and the step-boundary bookkeeping. True when training must stop."""
        if self._manual:
            stepped, self.ctx.stepped = self.ctx.stepped, False
        else:
            # One verdict for every optimizer: checked one by one, a skipped optimizer's gradients are
            # dropped before the next is checked, which then stepped alone (and the skip counted twice).
            stepped = self.guard.check(loss, self.state.step + 1)
            for opt in self.rt.optimizers:
                if stepped:
                    self._step_one(opt)
                else:
                    zero_grad(opt, self.rt.set_to_none)
        if stepped:
            self.rt.end_step()
            if self._per_step_schedulers:
                self._step_schedulers()
        else:
            self.state.skipped_steps += 1
        self.state.step += 1
        run.loss_meter.add(loss)
        return self._step_boundary(run)

    def _step_boundary(self, run: FitState) -> bool:
        """Per step: a few integer comparisons; the rare events run only when one is due."""
        step = self.state.step
        if step >= run.next_event:
            self._events(step)
        if (
            step >= run.step_limit
            or run.signals.requested
            or self.state.early_stop
            or (run.deadline is not None and time.monotonic() >= run.deadline)
        ):
            run.stop_reason = self._limits_reached()
        return run.stop_reason is not None

    # -- optimizer steps (the hot loop's, and manual optimization's ctx.step) -------------------

    def _step_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if self.config.gradient_clip_val is not None:
            self.rt.clip_gradients(optimizer, self.config.gradient_clip_val)
        self.guard.arm((optimizer,))  # fused optimizers on a GPU: the verdict skips the update there
        self.rt.optimizer_step(optimizer)
        self.guard.disarm((optimizer,))

    def _apply_optimizer(self, optimizer: torch.optim.Optimizer) -> bool:
        """Manual optimization's ``ctx.step``: guard, then step. False when the guard skipped it."""
        if not self.guard.check(None, self.state.step + 1):
            zero_grad(optimizer, self.rt.set_to_none)
            return False
        self._step_optimizer(optimizer)
        return True

    def _step_schedulers(self) -> None:
        for sched in self.schedulers:
            if not isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                sched.step()

    # -- events at step boundaries: warm-up's end, logging, validation, checkpoints ----------

    def _events(self, step: int) -> None:
        """End of warm-up, logging, validation and checkpoints that fall on this step."""
        cfg, run = self.config, self._run
        run.clock.at_step(step, self.state.samples)
        if step % cfg.log_every_n_steps == 0:
            self._log_metrics()
        if run.val_every and step % run.val_every == 0 and run.val_loader is not None and not self._epoch_validates():
            self._run_validation()
        if cfg.checkpoint_every_n_steps and step % cfg.checkpoint_every_n_steps == 0:
            self._save_checkpoint(at_epoch_end=False)
        run.next_event = self._next_event_after(step, run)

    def _next_event_after(self, step: int, run: FitState) -> int:
        cfg = self.config
        periods = [p for p in (cfg.log_every_n_steps, run.val_every, cfg.checkpoint_every_n_steps) if p]
        upcoming = min((step // p + 1) * p for p in periods)
        if run.clock.warming_up and run.clock.warmup_until > step:
            upcoming = min(upcoming, run.clock.warmup_until)
        return upcoming

    # -- epoch boundary, validation, limits --------------------------------------------------

    def _epoch_validates(self) -> bool:
        """Whether this step ends an epoch whose end-of-epoch validation is about to run anyway."""
        epoch_len = self._run.epoch_len
        return (
            isinstance(self.config.val_check_interval, float)
            and epoch_len is not None
            and self.state.batches_done == epoch_len
        )

    def _end_epoch(self) -> None:
        self._read_guard()
        cfg, run = self.config, self._run
        epoch = self.state.epoch
        if (
            run.val_loader is not None
            and not isinstance(cfg.val_check_interval, int)
            and (epoch + 1) % cfg.check_val_every_n_epoch == 0
        ):
            self._run_validation()
        if cfg.scheduler_interval == "epoch":
            self._step_schedulers()
        self._callback("on_epoch_end", epoch)
        self.state.epoch += 1
        self.state.batches_done = 0
        every = cfg.checkpoint_every_n_epochs or (
            1 if cfg.checkpoint_dir and not cfg.checkpoint_every_n_steps else None
        )
        if cfg.checkpoint_dir and every and self.state.epoch % every == 0:
            self._save_checkpoint(at_epoch_end=True)
        run.stop_reason = self._limits_reached()

    def _run_validation(self) -> None:
        self._read_guard()
        metrics = self.validate()
        self._log_metrics(extra=metrics)
        for sched in self.schedulers:
            if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                sched.step(metrics["val_loss"])
        if self.early_stopping is not None and self.early_stopping.update(metrics):
            self.state.early_stop = True

    def _val_loss(self, batch: Any) -> torch.Tensor:
        if self.val_step_fn is not None:
            return _loss_of(self.val_step_fn(self.ctx, batch))
        if self.step_fn is not None and not self.config.manual_optimization:
            return _loss_of(self.step_fn(self.ctx, batch))
        if self.loss_fn is None:
            raise ValueError("validation needs loss_fn or val_step_fn(ctx, batch) -> loss.")
        inputs, targets = batch
        return self._run_loss(self.rt.model(inputs), targets)  # type: ignore[misc]  # checked above

    def _read_guard(self) -> None:
        """Read the guard's device-side verdicts (stop mode raises here) before anything acts on the
        weights: a checkpoint, validation and its callbacks, the end of an epoch. Once per event."""
        self.state.skipped_steps = max(self.state.skipped_steps, self.guard.report())

    def _limits_reached(self) -> str | None:
        cfg, s, run = self.config, self.state, self._run
        if run.signals.requested:
            return "preempted"
        if cfg.max_steps is not None and s.step >= cfg.max_steps:
            return "max_steps"
        if run.max_epochs is not None and s.epoch >= run.max_epochs:
            return "max_epochs"
        if run.deadline is not None and time.monotonic() >= run.deadline:
            return "max_time"
        if s.early_stop and s.epoch >= cfg.min_epochs and s.step >= cfg.min_steps:
            return "early_stopping"
        return None

    # -- logging -----------------------------------------------------------------------------

    def _log_metrics(self, extra: dict[str, float] | None = None) -> None:
        run = self._run
        metrics: dict[str, Any] = {"step": self.state.step, "epoch": self.state.epoch}
        train_loss = run.loss_meter.pop_mean()
        if train_loss is not None:
            metrics["train_loss"] = train_loss
        if extra:
            metrics.update(extra)
        if len(metrics) == 2:  # nothing new since the last log
            return
        skipped = self.guard.report()
        if skipped:
            metrics["skipped_steps"] = skipped
            self.state.skipped_steps = max(self.state.skipped_steps, skipped)
        if self.rt.optimizers:
            metrics["lr"] = float(self.rt.optimizers[0].param_groups[0]["lr"])
        rate = run.clock.rate(self.state.samples)
        if rate:
            metrics["samples_per_s"] = rate
        metrics = self.ranks.reduce_logged(metrics)  # distributed: mean loss, summed rate (at log time only)
        self.state.history.append(metrics)
        for logger in run.loggers:
            logger.log(metrics)
        run.progress.update(self.state.step, metrics)
        self._callback("on_log", metrics)

    def _callback(self, hook: str, *args: Any) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, hook, None)
            if fn is not None:
                fn(self, *args)

    # -- checkpoints and the result -------------------------------------------------------------

    def _save_checkpoint(self, at_epoch_end: bool) -> None:
        started = time.monotonic()
        self._read_guard()
        self.checkpoints.save(self.state_dict(at_epoch_end), self.state.step)
        self._run.clock.exclude(time.monotonic() - started)

    def _resume(self, source: EpochSource) -> Position | None:
        resumed = self.checkpoints.resume(source)
        if resumed is None:
            return None
        self.state, position = resumed
        self.guard.resume(self.state.skipped_steps)
        return position

    def _result(self) -> FitResult:
        run, s = self._run, self.state
        metrics: dict[str, float] = {}
        for row in s.history:
            metrics.update({k: v for k, v in row.items() if isinstance(v, float)})
        rate = self.ranks.global_rate(run.clock.rate(s.samples))  # distributed: all ranks' samples/s together
        return FitResult(
            steps=s.step,
            epochs=s.epoch,
            samples=s.samples,
            samples_per_s=rate or 0.0,
            train_time_s=s.elapsed_s,
            metrics=metrics,
            history=s.history,
            stopped_by=run.stop_reason or "end_of_data",
            skipped_steps=s.skipped_steps,
            checkpoint=self.checkpoints.last_path,
            plan=self.plan,
            applied=list(self.rt.applied),
            skipped=list(self.rt.skipped),
        )


def _loss_of(out: Any) -> torch.Tensor:
    if isinstance(out, dict):
        out = out["loss"]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"step_fn must return the loss tensor (or a dict with 'loss'), got {type(out).__name__}.")
    return out
