"""`jit-script`: TorchScript; or dispatch-bound / elementwise-heavy without compile.

Reads: source, run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...analysis.source import dotted_name
from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ...requests import PlanRequest
from ..common import sources, static_finding
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class DispatchEvidence(Evidence):
    python_overhead_share: float
    pointwise_share: float  # of the profiled ops' time


def fuse_with_compile(ctx: Context) -> Iterator[Finding]:
    if ctx.facts.compiled or ctx.seen("compile") or ctx.model is None:
        return
    overhead, compute = ctx.dispatch_share(), ctx.share("compute") + ctx.share("python_overhead")
    pointwise = ctx.profile.get("pointwise_share", 0.0)
    if not (overhead >= 0.3 or (compute >= 0.4 and pointwise >= 0.3)):
        return
    mode = "reduce-overhead" if ctx.on_gpu and overhead >= 0.3 else True
    why = (
        f"{overhead:.0%} of step time is per-op dispatch overhead"
        if overhead >= 0.3
        else f"{pointwise:.0%} of op time is elementwise ops, each its own kernel and memory round trip"
    )
    f = Finding(
        "jit-script",
        site=ctx.module_site(ctx.model),
        category="compute",
        speedup=speedup_for_rule("jit-script"),
        message=f"{why}; torch.compile fuses them into fewer kernels"
        + (" and CUDA graphs replay the step without per-op launches." if mode == "reduce-overhead" else "."),
        fix=Fix(
            f"model = torch.compile(model{', mode=' + repr(mode) if mode != True else ''})",  # noqa: E712 - mode is a name or True
            plan={"compile": mode},
            lightning="model = torch.compile(model) before trainer.fit(model)",
            accelerate='Accelerator(dynamo_backend="inductor")',
            fabric="model = torch.compile(model) before fabric.setup(model)",
            hf_trainer="TrainingArguments(torch_compile=True)",
        ),
        evidence=DispatchEvidence(python_overhead_share=round(overhead, 3), pointwise_share=round(pointwise, 3)),
        request=PlanRequest({"compile": mode}, compile=True),
    )
    f.provisional("low")
    f.note = "Not measured by default (compiling takes a while); run the doctor with --compile to time it."
    yield f


def jit_script(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        for call, name in index.calls("torch.jit.script", "torch.jit.trace", "jit.script", "jit.trace"):
            yield static_finding(
                "jit-script",
                index,
                call,
                f"{name} compiles with TorchScript, which is in maintenance mode and fuses less than torch.compile.",
                Fix("torch.compile(fn_or_model)", plan={"compile": True}),
                speedup=speedup_for_rule("jit-script"),
            )
        for node in ast.walk(index.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for deco in node.decorator_list:
                    if dotted_name(deco).endswith(("jit.script", "jit.trace")):
                        yield static_finding(
                            "jit-script",
                            index,
                            deco,
                            f"@{dotted_name(deco)} compiles {node.name} with TorchScript, which is in "
                            "maintenance mode and fuses less than torch.compile.",
                            Fix("@torch.compile", plan={"compile": True}),
                            speedup=speedup_for_rule("jit-script"),
                        )


RULE = register(
    Rule(
        "jit-script",
        detect=(
            Detect("runtime", fuse_with_compile),
            Detect("static", jit_script),
        ),
    )
)
