"""The one loader pipeline: source -> read-ahead -> sampler -> DataLoader -> device, as the Trainer uses it."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader

import turbotrain as tt
from turbotrain.data import pipeline
from turbotrain.data.loader import rebuild_loader
from turbotrain.data.readahead import ReadAheadBatches
from turbotrain.train.resumable import EpochSource, ResumableBatches


def _pair(data: bytes):
    x = torch.tensor([len(data) / 1000.0, data[0] / 255.0])
    return x, x.sum()


def _rebuild(loader, **extra):
    return rebuild_loader(loader, **extra)


def test_read_ahead_wraps_the_resumable_batches_and_skips_what_a_resume_skips(served_urls):
    ds = tt.data.FileDataset(served_urls, decode=_pair)
    user = DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
    loader, batches = pipeline.training_loader(user, _rebuild, resumable=ResumableBatches)
    assert isinstance(loader.batch_sampler, ReadAheadBatches) and loader.batch_sampler.batches is batches
    assert isinstance(batches, ResumableBatches)
    loader.generator.manual_seed(7)
    full = [b[1] for b in loader]
    loader.generator.manual_seed(7)
    batches.plan_start(3, None)
    resumed = [b[1] for b in loader]
    assert len(full) == len(served_urls) // 4 and all(torch.equal(a, b) for a, b in zip(full[3:], resumed))


def test_the_trainer_reads_remote_files_ahead_and_trains(served_urls, cache_dir):
    ds = tt.data.FileDataset(served_urls, decode=_pair, cache=cache_dir)
    model = nn.Linear(2, 1)
    trainer = tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                         lambda out, y: ((out.squeeze(-1) - y) ** 2).mean(), max_epochs=2, progress=False)
    result = trainer.fit(DataLoader(ds, batch_size=8, shuffle=True))
    assert isinstance(trainer.fit_state.source.loader.batch_sampler, ReadAheadBatches)
    assert result.metrics["train_loss"] == result.metrics["train_loss"]  # finite, trained
    assert ds.cached_fraction() == 1.0


def test_epoch_source_builds_through_the_pipeline(served_urls):
    ds = tt.data.FileDataset(served_urls, decode=_pair)
    source = EpochSource(DataLoader(ds, batch_size=6), _rebuild)
    assert isinstance(source.loader.batch_sampler, ReadAheadBatches)
    assert sum(len(b[1]) for b in source.epoch(0)) == len(served_urls)


def test_an_epoch_ends_with_every_file_it_read_in_the_cache_even_on_a_slow_disk(served_urls, cache_dir, monkeypatch):
    """Cache writes run on threads of their own; the epoch's end waits for the last of them, so a run that stops
    there (or a next job reading the cache) finds every file it read."""
    import time

    from turbotrain.data.cache import DiskCache

    slow_put = DiskCache.put

    def put(self, *args, **kwargs):
        time.sleep(0.02)  # a disk slower than the reads
        return slow_put(self, *args, **kwargs)

    monkeypatch.setattr(DiskCache, "put", put)
    ds = tt.data.FileDataset(served_urls, decode=_pair, cache=cache_dir)
    source = EpochSource(DataLoader(ds, batch_size=8), _rebuild)
    assert sum(len(b[1]) for b in source.epoch(0)) == len(served_urls)
    assert ds.cached_fraction() == 1.0
