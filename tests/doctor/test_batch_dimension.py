"""Where the batch is in a model's input (issue 45): a `[seq, batch]` transformer's batch is its second dim."""

from __future__ import annotations

import torch
from torch import nn

from turbotrain.doctor.record.forward_facts import forward_facts


class WordLM(nn.Module):
    """pytorch/examples' word_language_model layout: token ids `[seq, batch]`, batch_first left False."""

    def __init__(self, tokens=100, dim=32):
        super().__init__()
        self.embed = nn.Embedding(tokens, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=64)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(dim, tokens)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)))


class PatchAttention(nn.Module):
    """An image model that transposes to `[seq, batch, dim]` for its attention: the input's batch is dim 0."""

    def __init__(self, dim=16):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, 4)
        self.attn = nn.MultiheadAttention(dim, 2)

    def forward(self, x):
        seq = self.patch(x).flatten(2).permute(2, 0, 1)
        return self.attn(seq, seq, seq)[0].mean(0)


def test_a_sequence_first_transformer_has_its_batch_in_the_second_dimension():
    facts = forward_facts(WordLM(), (torch.randint(0, 100, (35, 20)),), None)
    assert (facts.batch_dim, facts.batch_size) == (1, 20)   # 35 is the sequence length (bptt)


def test_batch_first_layers_and_images_keep_the_first_dimension():
    lm = WordLM()
    for layer in lm.encoder.layers:
        layer.self_attn.batch_first = True
    lm.encoder.layers[0].batch_first = True
    assert forward_facts(lm, (torch.randint(0, 100, (20, 35)),), None).batch_size == 20
    facts = forward_facts(PatchAttention(), (torch.randn(6, 3, 16, 16),), None)
    assert (facts.batch_dim, facts.batch_size) == (0, 6)


def test_one_unbatched_state_is_one_sample_and_a_larger_batch_stacks_copies_of_it():
    """A policy fed one environment state (pytorch/examples' actor-critic: a `[4]` CartPole observation) trains on
    one sample, not four; a larger batch is k states stacked, which the model takes as it is."""
    from turbotrain.doctor.analysis.replay import repeat_batch
    from turbotrain.doctor.record.forward_facts import capture_inputs

    policy = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 2))
    state = torch.randn(4)
    facts = forward_facts(policy, (state,), None)
    assert facts.unbatched and facts.batch_size == 1
    capture = capture_inputs(policy, (state,), None, facts, None)
    assert capture is not None and capture.unbatched and capture.batch_size == 1
    (stacked,), _ = repeat_batch(capture, 8)
    assert stacked.shape == (8, 4) and torch.equal(stacked[5], state)
    assert policy(stacked).shape == (8, 2)
    # A batch of four states, a conv net's one [C, H, W] image, and token ids keep their reading.
    assert forward_facts(policy, (torch.randn(4, 4),), None).batch_size == 4
    conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.LazyLinear(2))
    one_image = forward_facts(conv, (torch.randn(3, 16, 16),), None)
    assert one_image.unbatched and one_image.batch_size == 1
    assert not forward_facts(conv, (torch.randn(2, 3, 16, 16),), None).unbatched
    assert forward_facts(WordLM(), (torch.randint(0, 100, (35, 20)),), None).batch_size == 20
