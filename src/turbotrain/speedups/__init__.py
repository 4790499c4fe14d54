"""One module per speed-up; each registers itself in :mod:`turbotrain.speedups.registry`.

Every module exposes a pure function usable without the Trainer (for example
:func:`turbotrain.speedups.channels_last.to_channels_last`) and one registry entry saying
which Plan field it answers, what it needs, whether it is exact, which models it is for,
how the tuner decides it, how it is exported, which doctor rules detect its absence and how
the benchmark measures it (see ``docs/plan.md``, "Adding a speed-up").
"""

from .registry import BenchEntry, Order, Speedup, all_speedups, get, register

__all__ = ["BenchEntry", "Order", "Speedup", "all_speedups", "get", "register"]
