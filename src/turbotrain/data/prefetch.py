"""Device prefetch: the next batch is copied to the GPU on a side stream while this one computes."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import torch

from .transfer import tensors_in

__all__ = ["DeviceLoader"]


class DeviceLoader:
    """Iterate ``loader`` yielding batches already moved by ``to_device``.

    With ``prefetch`` on a CUDA device, batch k+1's host-to-device copy is issued on a side
    stream before batch k is handed out, so the copy overlaps batch k's compute (the copy
    is truly asynchronous only from pinned memory: pair with ``pin_memory=True``). On
    other devices it is a plain per-batch move.
    """

    def __init__(self, loader: Iterable, to_device: Callable[[Any], Any], device: torch.device, prefetch: bool = False):
        self.loader = loader
        self.to_device = to_device
        self.device = device
        self.prefetch = prefetch and device.type == "cuda"

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]  # the wrapped loader's len(), or its TypeError

    def __iter__(self) -> Iterator[Any]:
        if not self.prefetch:
            for batch in self.loader:
                yield self.to_device(batch)
            return
        yield from self._prefetching()

    def _prefetching(self) -> Iterator[Any]:
        side = torch.cuda.Stream(self.device)
        main = torch.cuda.current_stream(self.device)
        it = iter(self.loader)

        def issue_next():
            try:
                host = next(it)
            except StopIteration:
                return None
            with torch.cuda.stream(side):
                return self.to_device(host)

        upcoming = issue_next()
        while upcoming is not None:
            # The compute stream must not read the batch before its copy finished.
            main.wait_stream(side)
            current = upcoming
            for t in tensors_in(current):
                # Memory allocated on the side stream is used on the main one: tell the
                # caching allocator, or it may hand the block out again too early.
                t.record_stream(main)
            upcoming = issue_next()
            yield current
