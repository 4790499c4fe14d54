"""Pipeline parallelism on PyTorch's own engine, ``torch.distributed.pipelining``, for the user's model.

``Plan(strategy="pipeline", pipeline_stages=S, microbatches=M, schedule=...)`` splits the model at
``split_points`` (module names, each the first module of a stage; by default the largest
``nn.ModuleList`` cut evenly) and runs its stages on the processes of a launch:

* the split is traced with ``torch.distributed.pipelining.pipeline`` (``torch.export``) on a **meta**
  copy of the model, at the first batch (the trace needs the micro-batch's shape); each process then
  materialises only its own stages' parameters: the user's own tensors when the model was built for
  real, or fresh ones (``to_empty`` + ``reset_parameters()``) when it was built on the meta device;
  the other stages' parameters are dropped from the user's model;
* the user's optimizer keeps its class, settings, param groups (and any scheduler built on it) and is
  pointed at this process's parameters only (said in the log);
* each batch is one optimizer step: the schedule (GPipe, 1F1B, interleaved 1F1B) splits it into
  ``M`` micro-batches, sums their gradients and divides by ``M``; the step's loss is the mean of the
  micro-batch losses, on the processes holding the last stage;
* with more processes than one pipeline needs, the processes form a ``(dp, pp)`` DeviceMesh and
  each stage is sharded with FSDP2 across the ``dp`` replicas (DDP is refused: see :func:`refuse_ddp`);
* gradient clipping uses the global norm over every stage; validation runs the schedule's ``eval``
  on stages traced in eval mode; checkpoints go through ``torch.distributed.checkpoint`` (each stage
  writes its own part).

Every mistake that would otherwise hang the processes or compute on garbage is refused first, on every
process alike: fewer micro-batches than stages, a batch that does not divide into the micro-batches,
a split point that names no module, more stages than the processes allow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from .. import distributed as tdist
from ..config import ConfigError
from .pipeline_layout import Layout, bubble_fraction, layout_for, make_schedule
from .pipeline_split import check_split_points, default_split_points, meta_copy, stage_of_each_parameter, trace_stages
from .pipeline_tensors import materialise_modules, real_buffers, repoint_optimizers, set_tensor

# Layout, layout_for, bubble_fraction (pipeline_layout.py) and default_split_points (pipeline_split.py)
# were defined here first: still importable from here.
__all__ = [
    "Layout",
    "layout_for",
    "default_split_points",
    "PipelineRunner",
    "apply_to_runtime",
    "bubble_fraction",
    "refuse_ddp",
]

log = logging.getLogger("turbotrain")


def refuse_ddp() -> ConfigError:
    return ConfigError(
        "DDP cannot wrap a pipeline stage: torch's DDP reducer expects one forward and backward per step, and a "
        "schedule runs several (GPipe crashes in reducer.cpp; static_graph=True trains silently wrong). Use "
        "strategy='pipeline' alone: with more processes than stages it shards each stage with FSDP over the "
        "extra processes (a (dp, pp) DeviceMesh)."
    )


def _batch_parts(batch: Any) -> tuple[tuple[torch.Tensor, ...], Any]:
    try:
        inputs, targets = batch
    except (TypeError, ValueError):
        raise TypeError(f"a pipeline trains on (inputs, targets) batches, got {type(batch).__name__}") from None
    return (tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)), targets


@dataclass
class _Built:
    """One traced pipeline (train or eval mode, one micro-batch shape) on this process."""

    stages: list[Any]
    schedule: Any
    has_first: bool
    has_last: bool


class PipelineRunner:
    """This process's part of the pipeline: stages, schedule, optimizer, and the step the Trainer calls."""

    def __init__(self, rt):
        plan = rt.plan
        self.rt = rt
        self.user_model = rt.module
        self.launched = tdist.is_launched()
        world = tdist.world_size() if self.launched else 1
        self.layout = layout_for(plan, world) if self.launched else None
        self.stages = stages = self.layout.stages if self.layout else (plan.pipeline_stages or 2)
        self.microbatches = self.layout.microbatches if self.layout else (plan.microbatches or stages)
        self.split_points: list[str] = []
        self.loss_fn: Callable | None = None
        self.after_build: list[Callable[[], None]] = []  # the Trainer re-reads the optimizers' parameters
        self.pending_load: Callable[[], None] | None = None  # a checkpoint to load once the stages exist
        self.stage_modules = nn.ModuleDict()  # this process's stages, what checkpoints hold
        self._pipes: dict[Any, _Built] = {}
        self._train_key: Any = None
        self._train: _Built | None = None
        self.mesh = None
        if not self.launched:
            log.warning(
                "turbotrain: strategy='pipeline' in a single process started without a launcher: the %d "
                "stages run as one model, each batch as %d accumulated micro-batches (the same numbers); "
                "run it with `turbotrain launch --nproc-per-node %d ...` to split it",
                stages,
                self.microbatches,
                stages,
            )
            self._materialise_all(rt)
            return
        tdist.init_process_group(rt.device)
        self.rank = tdist.rank()
        self.pp_rank = self.rank % self.layout.pp
        self.dp_rank = self.rank // self.layout.pp
        self.stage_ids = self.layout.stage_ids(self.pp_rank)
        self._make_groups()
        self._skeleton = meta_copy(rt.module)

    @staticmethod
    def _materialise_all(rt) -> None:
        """One process: every layer real (initialised like a stage's when built on meta), the optimizer following."""
        model = rt.module
        old = dict(model.named_parameters())
        materialise_modules(model, {name.rpartition(".")[0] for name in old}, rt.device)
        real_buffers(model, [name for name, _ in model.named_buffers()], rt.device)
        new = dict(model.named_parameters())
        repoint_optimizers(rt.optimizers, {old[n]: new[n] for n in old})

    # -- processes -------------------------------------------------------------------------

    def _make_groups(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        lay = self.layout
        self.mesh = init_device_mesh(self.rt.device.type, (lay.dp, lay.pp), mesh_dim_names=("dp", "pp"))
        self.pp_group = self.mesh.get_group("pp")

    def configure(self, loss_fn: Callable | None, split_points: list[str] | None) -> None:
        """What the Trainer knows and the Plan does not: the loss and where to cut (checked here, before any step)."""
        if loss_fn is None:
            raise ConfigError(
                "strategy='pipeline' needs loss_fn(outputs, targets): the last stage computes it inside "
                "the schedule (step_fn is not supported under a pipeline)."
            )
        self.loss_fn = loss_fn
        points = list(split_points) if split_points else default_split_points(self.user_model, self.stages)
        check_split_points(self.user_model, points, self.stages)
        self.split_points = points

    @property
    def built(self) -> bool:
        return self._train is not None or not self.launched

    # -- building (at the first batch: the trace needs its micro-batch shape) ----------------

    def _microbatch(self, inputs: tuple[torch.Tensor, ...], training: bool) -> tuple[torch.Tensor, ...]:
        """The first micro-batch, on the meta device: what the trace needs."""
        n = self._check_divides(inputs, training)
        return tuple(t.detach()[: n // self.microbatches].to("meta") for t in inputs)

    def _check_divides(self, inputs: tuple[torch.Tensor, ...], training: bool) -> int:
        n = inputs[0].shape[0]
        if n % self.microbatches:
            raise ConfigError(
                f"a {'training' if training else 'validation'} batch of {n} samples does not divide into "
                f"Plan.microbatches={self.microbatches}: the stages' receive buffers keep the first micro-batch's "
                "shape, so every batch must hold a multiple of microbatches samples. Choose a batch size that "
                "divides (and drop_last=True in the DataLoader when the data set does not divide either)."
            )
        return n

    def _materialise(self, pipe) -> None:
        """This process's parameters and buffers, real and on the device; the user's optimizer moved onto them."""
        device, model = self.rt.device, self.user_model
        for opt in self.rt.optimizers:
            if any(opt.state.values()):
                raise ConfigError(
                    f"{type(opt).__name__} has already stepped (it holds state), and a pipeline keeps "
                    "only its stage's parameters: build the Trainer before the first optimizer step, or "
                    "resume the state from a checkpoint with fit(resume=True)."
                )
        owner = stage_of_each_parameter(pipe)
        mine = {name for name, i in owner.items() if i in self.stage_ids}
        old = dict(model.named_parameters())
        materialise_modules(model, {name.rpartition(".")[0] for name in mine}, device)
        real_buffers(
            model, [name for i in self.stage_ids for name, _ in pipe.get_stage_module(i).named_buffers()], device
        )
        new = dict(model.named_parameters())
        for name, param in old.items():  # the other stages' layers leave this process
            if name not in mine:
                set_tensor(model, name, nn.Parameter(torch.empty_like(param, device="meta"), param.requires_grad))
        for opt in self.rt.optimizers:
            total = sum(len(g["params"]) for g in opt.param_groups)
            repoint_optimizers([opt], {old[name]: new[name] for name in mine})
            log.info(
                "turbotrain: pipeline stage(s) %s of %d: %s rebuilt over this stage's %d of %d parameter tensors "
                "(same class, param groups and settings)",
                self.stage_ids,
                self.layout.stages,
                type(opt).__name__,
                sum(len(g["params"]) for g in opt.param_groups),
                total,
            )

    def _stages_of(self, pipe) -> list[Any]:
        """This process's PipelineStages of ``pipe``, running the user's (materialised) tensors."""
        from torch.distributed.pipelining import PipelineStage

        try:  # tensors made in forward (torch.arange(..., device=x.device)) were traced on the meta device
            from torch.distributed.pipelining._IR import _modify_graph_op_device
        except ImportError:  # pragma: no cover - a later torch
            _modify_graph_op_device = None  # type: ignore[assignment]  # checked before its use
        tensors = {**dict(self.user_model.named_parameters()), **dict(self.user_model.named_buffers())}
        stages = []
        for i in self.stage_ids:
            module = pipe.get_stage_module(i)
            for name, _ in [*module.named_parameters(), *module.named_buffers()]:
                set_tensor(module, name, tensors[name])
            if _modify_graph_op_device is not None and isinstance(module, torch.fx.GraphModule):
                _modify_graph_op_device(module, self.rt.device)
            stages.append(PipelineStage(module, i, self.layout.stages, self.rt.device, group=self.pp_group))
        return stages

    def _shard(self, stages: list[Any]) -> None:
        """Pipeline x FSDP: each stage one FSDP unit over the dp dimension; the optimizer and the user's model
        follow the shards. One unit per stage, not per block: the schedule keeps a stage's parameters gathered
        across its micro-batches anyway (no resharding between backward passes), and per-block units peaked
        about 150 MiB higher per process, and ran slower, in benchmarks/pipeline.py on the CPU."""
        from torch.distributed.fsdp import fully_shard

        from .fsdp import rebind_optimizer

        for stage in stages:
            before = dict(stage.submod.named_parameters())
            fully_shard(stage.submod, mesh=self.mesh["dp"])
            after = dict(stage.submod.named_parameters())
            for opt in self.rt.optimizers:
                rebind_optimizer(opt, {before[n]: after[n] for n in before})
            for name, param in after.items():  # the full tensors must not stay alive in the user's model
                set_tensor(self.user_model, name, param)

    def _build(self, key: Any, inputs: tuple[torch.Tensor, ...], training: bool) -> _Built:
        """Trace and build; every process learns whether every other one succeeded before any stage communicates
        (a process that failed alone would leave the others waiting for its activations forever)."""
        failed: BaseException | None = None
        try:
            built = self._build_here(key, inputs, training)
        except Exception as exc:  # noqa: BLE001 - re-raised below, on every process
            failed = exc
        flag = torch.tensor(float(failed is not None), device=self.rt.device)
        tdist.all_reduce_max_(flag)
        if failed is not None:
            raise failed
        if flag.item():
            raise ConfigError("another process of the pipeline failed to build its stage (its error is above)")
        if self.pending_load is not None:  # resuming: every stage loads its part (collectively)
            load, self.pending_load = self.pending_load, None
            load()
        return built

    def _build_here(self, key: Any, inputs: tuple[torch.Tensor, ...], training: bool) -> _Built:
        first = self._train is None
        if not first and self.layout.dp > 1:
            raise ConfigError(
                f"a {'training' if training else 'validation'} batch of another shape than the first training batch "
                f"({[tuple(t.shape) for t in inputs]}): under pipeline x FSDP every batch, validation included, must "
                "have the training batch's shape (drop_last=True, the same batch size for validation)."
            )
        if first and not training:
            raise ConfigError("a pipeline is built at the first training batch; validate after fit() has started.")
        pipe = trace_stages(
            self._skeleton, self._microbatch(inputs, training), self.split_points, self.layout.stages, training
        )
        if first:
            self._materialise(pipe)
        stages = self._stages_of(pipe)
        if first:
            for stage in stages:
                self.stage_modules[f"stage{stage.stage_index}"] = stage.submod
            if self.layout.dp > 1:
                self._shard(stages)
        schedule = make_schedule(self.layout, stages, self.loss_fn)  # type: ignore[arg-type]  # configure() set it
        built = _Built(
            stages, schedule, has_first=0 in self.stage_ids, has_last=self.layout.stages - 1 in self.stage_ids
        )
        self._pipes[key] = built
        if first:
            self.rt.module = self.rt.model = self.stage_modules
            for hook in self.after_build:
                hook()
        return built

    # -- the step ------------------------------------------------------------------------------

    def _pipe_for(self, inputs: tuple[torch.Tensor, ...], training: bool) -> _Built:
        shapes = tuple(t.shape for t in inputs)
        key = (training, shapes)
        built = self._pipes.get(key)
        if built is None and not training and self.layout.dp > 1 and (True, shapes) in self._pipes:
            built = self._pipes[key] = self._eval_on_training_stages(shapes)
        return built if built is not None else self._build(key, inputs, training)

    def _eval_on_training_stages(self, shapes: tuple[torch.Size, ...]) -> _Built:
        """Pipeline x FSDP validates through the training stages (FSDP owns their parameters; stages traced in
        eval mode cannot share them), whose traced graph keeps training-mode dropout and batch statistics."""
        modes = sorted(
            {
                type(m).__name__
                for m in self.user_model.modules()
                if isinstance(m, (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm))
                and getattr(m, "p", 1) > 0
            }
        )
        if modes:
            log.warning(
                "turbotrain: pipeline x FSDP validates on the training stages: their %s layers act as in "
                "training during validation",
                ", ".join(modes),
            )
        return self._pipes[(True, shapes)]  # the training stages traced for these shapes

    def _run(self, built: _Built, inputs, targets, training: bool) -> list[torch.Tensor]:
        losses: list[torch.Tensor] = []
        args = inputs if built.has_first else ()
        target = targets if built.has_last else None
        with self.rt.autocast():
            if training:
                built.schedule.step(*args, target=target, losses=losses, return_outputs=False)
            else:
                built.schedule.eval(*args, target=target, losses=losses)
        return losses

    def train_step(self, batch: Any) -> Any:
        """One optimizer step's forward and backward; the mean micro-batch loss (0.0 off the last stage)."""
        inputs, targets = _batch_parts(batch)
        if not self.launched:
            return self._local_step(inputs, targets)
        key = inputs[0].shape
        built = self._train
        if built is None or key != self._train_key or len(inputs) > 1:
            built = self._train = self._pipe_for(inputs, True)
            self._train_key = key
        losses = self._run(built, inputs, targets, True)
        return self._mean(losses, built.has_last)

    def _mean(self, losses: list[torch.Tensor], has_last: bool) -> Any:
        if not has_last:
            return 0.0 if self.rt.device.type != "cuda" else torch.zeros((), device=self.rt.device)
        loss = torch.stack([loss.detach() for loss in losses]).sum() / len(losses)
        return loss.item() if self.rt.device.type != "cuda" else loss

    def _local_losses(self, inputs, targets, training: bool) -> list[torch.Tensor]:
        """One process, no launcher: the whole model on the same micro-batches, each loss's backward in training."""
        self._check_divides(inputs, training)
        chunks = [torch.tensor_split(t, self.microbatches) for t in inputs]
        losses = []
        for i, target in enumerate(torch.tensor_split(targets, self.microbatches)):
            with self.rt.autocast():
                loss = self.loss_fn(self.user_model(*(c[i] for c in chunks)), target)  # type: ignore[misc]  # configure() set it
            if training:
                loss.backward()
            losses.append(loss)
        return losses

    def _local_step(self, inputs, targets) -> Any:
        """The schedule's arithmetic in one process: the micro-batches' gradients summed, then divided by M."""
        losses = self._local_losses(inputs, targets, True)
        for opt in self.rt.optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.div_(self.microbatches)
        return self._mean(losses, True)

    def eval_step(self, batch: Any) -> tuple[torch.Tensor, int]:
        """Mean micro-batch loss of a validation batch and its sample count (0 samples off the last stage)."""
        inputs, targets = _batch_parts(batch)
        if self.launched:
            built = self._pipe_for(inputs, False)
            losses = self._run(built, inputs, targets, False)
            if not built.has_last:
                return torch.zeros((), device=self.rt.device), 0
        else:
            losses = self._local_losses(inputs, targets, False)
        return torch.stack([loss.detach() for loss in losses]).sum() / len(losses), inputs[0].shape[0]

    # -- gradient clipping by the global norm ------------------------------------------------------

    def clip_gradients(self, optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
        """Clip by the norm of *every* stage's gradients together (per-stage clipping would change the direction)."""
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        grads = [p.grad for p in params]
        local = torch.nn.utils.get_total_norm(grads, foreach=True) if grads else torch.zeros((), device=self.rt.device)
        if hasattr(local, "full_tensor"):  # FSDP shards: the norm over the dp replicas' shards
            local = local.full_tensor()
        squared = local.double().pow(2)
        if self.launched:
            torch.distributed.all_reduce(squared, group=self.pp_group)
        total = squared.sqrt().to(local.dtype)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
        return total


def apply_to_runtime(rt) -> None:
    """The strategy switch's 'pipeline': refuse what cannot work, then hand the Runtime a PipelineRunner."""
    plan = rt.plan
    if plan.compile is not False:
        raise ConfigError(
            "Plan.compile with strategy='pipeline' is not supported yet: the stages are traced "
            "graphs run by the schedule; set compile=False."
        )
    if plan.precision == "fp16-mixed":
        raise ConfigError(
            "Plan.precision='fp16-mixed' with strategy='pipeline': the GradScaler would have to scale "
            "the loss inside the schedule; use 'bf16-mixed'."
        )
    if plan.sync_batchnorm:
        raise ConfigError("Plan.sync_batchnorm with strategy='pipeline' is not supported.")
    if isinstance(rt.model, nn.parallel.DistributedDataParallel):
        raise refuse_ddp()
    rt.pipeline = PipelineRunner(rt)
    rt.clip_gradients = rt.pipeline.clip_gradients  # this Runtime clips by the norm over every stage
