"""s3:// through a real local S3 server (moto), and alluxiofs:// routed through fsspec."""

from __future__ import annotations

import importlib.util

import fsspec
import pytest
from datahelpers import content_for
from fsspec.implementations.memory import MemoryFileSystem

import turbotrain as tt
from turbotrain.data.servers import LocalS3


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs", reason="s3fs is in the test extra: pip install -e '.[test]'")
    with LocalS3() as server:
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **server.storage_options)
        fs.mkdir("train-bucket")
        for i in range(12):
            fs.pipe(f"train-bucket/shards/s{i:02d}.bin", content_for(f"s{i:02d}.bin", 2000 + i))
        yield server


def test_s3_glob_read_and_cache(s3, cache_dir):
    ds = tt.data.FileDataset("s3://train-bucket/shards/*.bin", cache=cache_dir, storage_options=s3.storage_options)
    assert ds.urls[0] == "s3://train-bucket/shards/s00.bin" and len(ds) == 12
    assert ds.__getitems__(list(range(12))) == [content_for(f"s{i:02d}.bin", 2000 + i) for i in range(12)]
    assert ds.cached_fraction() == 1.0


def test_s3_missing_key_is_named(s3):
    ds = tt.data.FileDataset(["s3://train-bucket/shards/absent.bin"], storage_options=s3.storage_options)
    with pytest.raises(FileNotFoundError, match="s3://train-bucket/shards/absent.bin"):
        ds[0]


class _FakeAlluxio(MemoryFileSystem):
    """Stands in for alluxiofs.AlluxioFileSystem: what matters is that the URL goes to the registered class."""

    protocol = ("alluxiofs",)
    root_marker = "/"
    store: dict = {}
    pseudo_dirs = [""]

    @classmethod
    def _strip_protocol(cls, path):
        return "/" + str(path).split("://", 1)[-1].lstrip("/")


def test_alluxiofs_urls_are_routed_to_the_registered_fsspec_class(monkeypatch):
    from fsspec.registry import _registry

    # What `fsspec.register_implementation("alluxiofs", AlluxioFileSystem)` does, undone after the test.
    monkeypatch.setitem(_registry, "alluxiofs", _FakeAlluxio)
    fs = _FakeAlluxio()
    fs.pipe("/bucket/a.bin", b"through alluxio")
    ds = tt.data.FileDataset(["alluxiofs://bucket/a.bin"])
    assert isinstance(ds.fetcher.filesystem(ds.urls[0])[0], _FakeAlluxio)
    assert ds[0] == b"through alluxio"


@pytest.mark.skipif(importlib.util.find_spec("alluxiofs") is None,
                    reason="the alluxiofs package is not installed (pip install alluxiofs); an Alluxio cluster "
                           "cannot run here, so only its routing is checked")
def test_the_real_alluxiofs_package_is_what_fsspec_picks():
    from alluxiofs import AlluxioFileSystem

    fsspec.register_implementation("alluxiofs", AlluxioFileSystem, clobber=True)
    cls = fsspec.get_filesystem_class(tt.data.fetch.scheme_of("alluxiofs://bucket/train/a.bin"))
    assert cls is AlluxioFileSystem
