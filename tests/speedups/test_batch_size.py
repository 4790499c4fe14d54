import pytest
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler
from tiny import make_data, make_loader, make_mlp

import turbotrain as tt
from turbotrain.speedups.batch_size import round_to_multiple


def test_loader_rebuilt_with_the_planned_batch_size():
    rt = tt.prepare(make_mlp(), None, tt.Plan(device="cpu", batch_size=16))
    loader = rt.rebuild_loader(make_loader(n=64, batch_size=4))
    assert loader.batch_size == 16 and len(loader) == 4
    assert next(iter(loader))[0].shape[0] == 16


def test_custom_batch_sampler_is_an_error_that_says_where_to_change_it():
    rt = tt.prepare(make_mlp(), None, tt.Plan(device="cpu", batch_size=16))
    loader = DataLoader(make_data(), batch_sampler=BatchSampler(SequentialSampler(range(64)), 4, False))
    with pytest.raises(ValueError, match="custom batch_sampler.*BatchSampler"):
        rt.rebuild_loader(loader)


def test_round_to_multiple_of_eight():
    assert [round_to_multiple(n) for n in (1, 8, 15, 16, 100)] == [8, 8, 8, 16, 96]
