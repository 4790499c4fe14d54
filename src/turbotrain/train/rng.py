"""Capture and restore every random number generator a training run draws from.

The states are plain tensors, lists and tuples so checkpoints load with ``weights_only=True``.
"""

from __future__ import annotations

import random
from typing import Any, Iterable

import numpy as np
import torch

__all__ = ["capture", "restore", "generators_of"]


def _numpy_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "kind": kind,
        "keys": torch.from_numpy(keys.astype(np.int64)),  # type: ignore[attr-defined]  # the legacy 5-tuple
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def _set_numpy_state(state: dict[str, Any]) -> None:
    keys = state["keys"].numpy().astype(np.uint32)
    np.random.set_state((state["kind"], keys, state["pos"], state["has_gauss"], state["cached"]))


def generators_of(loader: Any) -> list[torch.Generator]:
    """Generators a DataLoader (and its sampler) draw from besides the global one."""
    found: list[torch.Generator] = []
    for owner in (
        loader,
        getattr(loader, "sampler", None),
        getattr(loader, "batch_sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    ):
        gen = getattr(owner, "generator", None)
        if isinstance(gen, torch.Generator) and all(gen is not g for g in found):
            found.append(gen)
    return found


def capture(generators: Iterable[torch.Generator] = ()) -> dict[str, Any]:
    """The state of Python's, NumPy's, torch's (CPU and CUDA) and the given generators."""
    return {
        "python": random.getstate(),
        "numpy": _numpy_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": [g.get_state() for g in generators],
    }


def restore(state: dict[str, Any], generators: Iterable[torch.Generator] = ()) -> None:
    py = state["python"]
    # A tuple survives torch.save/load as a tuple; the inner key list may come back as a list.
    random.setstate((py[0], tuple(py[1]), py[2]))
    _set_numpy_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    gens = list(generators)
    if len(gens) != len(state["generators"]):
        raise ValueError(
            f"the checkpoint holds {len(state['generators'])} data-loader generator state(s) "
            f"but this loader has {len(gens)}; resume with the same DataLoader set-up."
        )
    for gen, gen_state in zip(gens, state["generators"]):
        gen.set_state(gen_state)
