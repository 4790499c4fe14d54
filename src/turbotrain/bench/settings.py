"""What a bench run measures and how long: workloads, steps, repeats, and the switches of ``turbotrain bench``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .workloads import WORKLOADS

__all__ = ["BenchSettings"]


@dataclass
class BenchSettings:
    workloads: tuple[str, ...] = tuple(WORKLOADS)
    steps: int = 20  # measured steps per trial, at least (see min_trial_s)
    min_trial_s: float = 1.0  # more steps when the naive plan would measure less than this
    max_steps: int = 2000
    warmup: int = 3  # steps before them: compile, autotune, allocator warm-up
    repeats: int = 3  # interleaved rounds; median and spread come from them
    batches: int = 4  # distinct batches cycled by resident-path trials
    compile: bool = True  # measure plans that use torch.compile
    ablation: bool = True  # measure each speed-up alone (False: naive, fast and tuned only)
    tune: bool = True  # add the tuned plan when turbotrain.tuning is installed
    tune_budget_s: float = 60.0
    scale: str = "auto"  # "cpu", "gpu" (GPT-2 small, ResNet-50), "auto": gpu when on CUDA
    device: str = "auto"
    seed: int = 0
    quick: bool = False
    gpt_tokens: str = "bytes"  # "bytes" (loss falls) or "random" (GPT-2 vocabulary, uniform tokens)
    peak_tflops: float | None = None  # dense bf16 peak of the device when it is not in bench.peaks
    threads: int | None = None  # torch intra-op threads for the run (None: torch's default)
    data_files: int | None = None  # data workload: files to serve (None: 256, --quick 96)
    data_latency_ms: float | None = None  # data workload: nginx's wait before each first byte (None: 20, --quick 5)

    @classmethod
    def quick_run(cls, **overrides: Any) -> "BenchSettings":
        """A run that ends in minutes on a small CPU: no compile rows, no tuning, short trials."""
        return cls(
            **{
                "steps": 6,
                "min_trial_s": 0.2,
                "max_steps": 300,
                "warmup": 1,
                "repeats": 3,
                "compile": False,
                "tune": False,
                "quick": True,
                **overrides,
            }
        )

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 1 or self.repeats < 1 or self.batches < 1:
            raise ValueError("steps, warmup, repeats and batches must all be >= 1")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.min_trial_s < 0:
            raise ValueError(f"min_trial_s must be >= 0, got {self.min_trial_s}")
        if (self.data_files is not None and self.data_files < 1) or (self.data_latency_ms or 0) < 0:
            raise ValueError(
                f"data_files must be >= 1 and data_latency_ms >= 0, got {self.data_files} and {self.data_latency_ms}"
            )
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown:
            raise ValueError(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
