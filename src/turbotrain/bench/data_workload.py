"""The ``data`` reference workload: many small image files behind a real nginx that is slow to answer.

Every sample is one file: a class byte, then a 3x32x32 uint8 image (class-conditional like the
CNN's synthetic images, so the loss falls). The files are written to a temporary directory and
served by nginx on loopback (``turbotrain.data.servers.LocalNginx``): every response waits
``latency_s`` before its first byte (an object store's first-byte latency; nginx's ``limit_rate``
alone would not slow files this small) and each connection is held to ``limit_rate``. The model
is a small conv net, so a step waits on the files, not on the math.

How a row reads the files (its *source*):

* ``plain``: what a user writes without turbotrain, one blocking read of the whole file per sample
  in ``__getitem__`` (fsspec's ``cat_file``: one GET);
* ``files``: ``tt.data.FileDataset`` without a cache: a batch's files are fetched at once;
* ``cache``: ``tt.data.FileDataset`` with a fresh disk cache: epoch 1 fetches, epoch 2 reads the disk;
* ``local``: plain reads of the same files on local disk (the ceiling).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ..data import servers, stats
from ..data.fetch import scheme_of
from ..data.files import FileDataset
from .datasets import image_dataset
from .models import SmallConvNet
from .workload import Workload

__all__ = [
    "FilesWorkload",
    "files_workload",
    "ServedFiles",
    "ServerUnavailable",
    "PlainReads",
    "decode_sample",
    "nginx_missing",
    "SOURCES",
    "PLAIN",
    "FILES",
    "CACHE",
    "LOCAL",
]

PLAIN, FILES, CACHE, LOCAL = "plain", "files", "cache", "local"
IMAGE_SIZE, CLASSES = 32, 10
DEFAULT_FILES, DEFAULT_LATENCY_MS = 256, 20.0  # a full run
QUICK_FILES, QUICK_LATENCY_MS = 96, 5.0  # --quick
SOURCES = {
    PLAIN: "plain reads over HTTP (one blocking GET per sample in __getitem__)",
    FILES: "tt.data.FileDataset over HTTP, no cache (a batch's files fetched at once)",
    CACHE: "tt.data.FileDataset over HTTP with a fresh disk cache (epoch 2 reads the disk)",
    LOCAL: "plain reads of the same files on local disk",
}


def decode_sample(data: bytes) -> tuple[torch.Tensor, int]:
    """A file's (image, label): the first byte is the class, the rest a square 3-channel uint8 image."""
    side = int(round(((len(data) - 1) / 3) ** 0.5))
    pixels = torch.frombuffer(bytearray(data[1:]), dtype=torch.uint8).view(3, side, side)
    return _to_float(pixels), data[0]


def _to_float(pixels: torch.Tensor) -> torch.Tensor:
    return pixels.float().div_(255.0)


def quantized_images(samples: int, size: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CNN workload's class-conditional images as uint8 (what the files hold), and their labels."""
    images, labels = image_dataset(samples, size, classes, seed).tensors
    # The images are a template (about unit scale) plus noise of std 1.5: +-4 covers nearly all of it.
    return ((images + 4.0) * (255.0 / 8.0)).round().clamp_(0, 255).to(torch.uint8), labels


@dataclass(frozen=True)
class FilesWorkload(Workload):
    """A Workload whose samples are files; ``make_dataset`` gives the same samples decoded, in memory."""

    files: int
    latency_s: float
    image_size: int = IMAGE_SIZE
    classes: int = CLASSES
    limit_rate: str | None = "1m"

    @property
    def file_bytes(self) -> int:
        return 1 + 3 * self.image_size**2

    def describe(self) -> str:
        rate = f", limit_rate {self.limit_rate} per connection" if self.limit_rate else ""
        return (
            f"{self.files} files of {self.file_bytes / 1000:.1f} KB behind nginx "
            f"({self.latency_s * 1000:g} ms to first byte{rate})"
        )

    def write_files(self, folder: Path, seed: int = 0) -> list[Path]:
        """One file per sample in ``folder``: the class byte, then the image's bytes."""
        folder.mkdir(parents=True, exist_ok=True)
        pixels, labels = quantized_images(self.files, self.image_size, self.classes, seed)
        paths = []
        for i, (image, label) in enumerate(zip(pixels, labels.tolist())):
            path = folder / f"{i:05d}.img"
            path.write_bytes(bytes([label]) + image.numpy().tobytes())
            paths.append(path)
        return paths


def files_workload(
    scale: str = "cpu", quick: bool = False, files: int | None = None, latency_ms: float | None = None
) -> FilesWorkload:
    """The data workload; ``quick`` is the small variant of ``turbotrain bench --quick``.

    The same at every scale: what it measures is how files reach the model, and the model is
    kept small on purpose so that the reads, not the math, set the pace.
    """
    count = files if files is not None else (QUICK_FILES if quick else DEFAULT_FILES)
    latency_s = (latency_ms if latency_ms is not None else (QUICK_LATENCY_MS if quick else DEFAULT_LATENCY_MS)) / 1000
    if count < 1 or latency_s < 0:
        raise ValueError(
            f"the data workload needs files >= 1 and latency_ms >= 0, got {count} and {latency_s * 1000:g}"
        )
    batch = min(32, count)

    def make_dataset(seed: int) -> TensorDataset:
        pixels, labels = quantized_images(count, IMAGE_SIZE, CLASSES, seed)
        return TensorDataset(_to_float(pixels), labels)

    return FilesWorkload(
        "data",
        "samples",
        1,
        batch,
        lambda: SmallConvNet(CLASSES),
        F.cross_entropy,
        make_dataset,
        lr=2e-3,
        files=count,
        latency_s=latency_s,
    )


class PlainReads(Dataset):
    """What a user writes without turbotrain: one blocking read of the whole file per sample.

    The read is fsspec's ``cat_file``: one GET over a kept-alive connection (``fsspec.open(url)``
    would first send a HEAD, a second wait on a slow server, and flatter every speed-up here).
    Each read is counted in ``turbotrain.data.stats`` (a few microseconds), like the data layer's
    own reads, so every row of the bench can say what it read from where.
    """

    def __init__(self, urls: list[str], decode: Callable[[bytes], Any]):
        self.urls = urls
        self.decode = decode
        stats.share_with_workers()

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, index: int) -> Any:
        import fsspec

        url = self.urls[index]
        started = time.perf_counter()
        fs, path = fsspec.core.url_to_fs(url)
        data = fs.cat_file(path)
        stats.record(scheme_of(url), len(data), time.perf_counter() - started)
        return self.decode(data)


class ServerUnavailable(RuntimeError):
    """nginx is missing or would not start: the data workload cannot run here."""


def nginx_missing() -> str | None:
    """Why the data workload cannot serve its files here, or None when nginx is installed."""
    if servers.nginx_binary() is None:
        return (
            "nginx is not installed, and the data workload serves its files through a real nginx: install it "
            "with `bash scripts/ci-deps.sh` (or `apt-get install nginx-light`) and run the bench again"
        )
    return None


class ServedFiles:
    """The workload's files written to ``root``, on local disk and behind nginx until closed."""

    def __init__(self, workload: FilesWorkload, root: Path, seed: int = 0):
        self.workload = workload
        self.root = Path(root)
        self.paths = [str(p) for p in workload.write_files(self.root / "files", seed)]
        self.server = servers.LocalNginx(
            self.root / "files", latency_s=workload.latency_s, limit_rate=workload.limit_rate, workers=2
        )
        self.urls: list[str] = []

    def __enter__(self) -> "ServedFiles":
        try:
            self.server.start()
        except RuntimeError as exc:  # no echo module, or nginx would not listen: said, not crashed on
            raise ServerUnavailable(f"nginx could not serve the data workload's files: {exc}") from exc
        self.urls = [f"{self.server.url}/{os.path.basename(p)}" for p in self.paths]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.stop()

    def dataset(self, source: str, cache_dir: str | os.PathLike | None = None) -> Dataset:
        if source == PLAIN:
            return PlainReads(self.urls, decode_sample)
        if source == LOCAL:
            return PlainReads(self.paths, decode_sample)
        if source == FILES:
            return FileDataset(self.urls, decode=decode_sample, max_in_flight=self.workload.batch_size)
        if source == CACHE:
            if cache_dir is None:
                raise ValueError("the 'cache' source needs a cache directory")
            return FileDataset(self.urls, decode=decode_sample, cache=cache_dir, max_in_flight=self.workload.batch_size)
        raise ValueError(f"unknown source {source!r}; choose from {', '.join(SOURCES)}")

    def loader(self, source: str, cache_dir: str | os.PathLike | None = None, seed: int = 0) -> DataLoader:
        """A plain DataLoader over ``source`` (shuffled, whole batches): what the user's script builds."""
        return DataLoader(
            self.dataset(source, cache_dir),
            batch_size=self.workload.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
            drop_last=True,
        )
