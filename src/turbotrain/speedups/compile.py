"""torch.compile: fuse pointwise ops and cut Python overhead (modes: default, reduce-overhead, max-autotune)."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any, Callable

import torch

from .model_info import ANY_MODEL
from .policy import Export, timed
from .registry import BenchEntry, Order, Speedup, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime


def compile_model(model: torch.nn.Module, mode: str = "default") -> torch.nn.Module:
    """``torch.compile(model, mode=mode)``; parameters are shared with ``model``."""
    return torch.compile(model, mode=mode)  # type: ignore[return-value]  # a Module in: an OptimizedModule out


def compile_loss(loss_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(loss_fn)`` in the default mode: a loss over a large output (a language model's
    logits) is several memory-bound passes in eager mode (a float32 copy, log-softmax, gather) and one fused
    pass compiled. No CUDA graphs: a caller may hold one step's loss while the next step runs."""
    return torch.compile(loss_fn)


def _apply(rt: Runtime) -> None:
    mode = rt.plan.compile_mode
    if mode is not None:  # prepare applies an entry only where its switch is active
        rt.model = compile_model(rt.model, mode)
        if rt.device.type == "cuda":  # on a CPU the loss's compile costs more than its passes
            rt.loss_wrapper = compile_loss


def _requires(hw, plan) -> str | None:
    if not hw.is_cuda and not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        return "torch.compile on CPU needs a C++ compiler (g++ or clang++) on PATH; none was found"
    return None


def _recommend(hw, info):
    if hw.is_cuda:
        return True
    # Measured on a 2-core AVX512 CPU: compile gains ~1.9x on a small CNN but loses ~13% on a
    # small transformer, so on CPU only conv-dominated models get it by rule.
    return True if info.is_conv_net else None


# On a GPU the tuner also times the modes that autotune kernels; CPU inductor has no such modes worth a compile.
CUDA_MODES = ("max-autotune-no-cudagraphs", "reduce-overhead")


def _values(hw, base) -> tuple:
    return (True, *CUDA_MODES) if hw.is_cuda else (True,)


def _code(plan, framework: str) -> list[str]:
    # Accelerate compiles from its config (dynamo_config); Lightning compiles the model the user passes.
    if plan.compile is False or framework != "lightning":
        return []
    return [f'model = torch.compile(model, mode="{plan.compile_mode}")  # before trainer.fit']


def _accelerate(plan) -> dict:
    if plan.compile is False:
        return {}
    return {
        "dynamo_config": {
            "dynamo_backend": "INDUCTOR",
            "dynamo_mode": plan.compile_mode,
            "dynamo_use_dynamic": False,
            "dynamo_use_fullgraph": False,
        }
    }


ENTRY = register(
    Speedup(
        name="compile",
        field="compile",
        order=Order.MODEL_COMPILE,
        apply=_apply,
        requires=_requires,
        recommend=_recommend,
        exact=True,
        doctor_rules=("jit-script",),
        summary="torch.compile fuses kernels and removes per-op Python overhead",
        bench=BenchEntry(("gpt", "cnn"), {"compile": True}),
        applies_to=ANY_MODEL,
        tune=timed(_values, expensive=True),
        export=Export(accelerate=_accelerate, code=_code),
    )
)
