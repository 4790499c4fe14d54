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


class GraphConvolution(nn.Module):
    """pytorch/examples' GCN layout: every node's features `[N, F]` and the graph `[N, N]`, the whole graph a step."""

    def __init__(self, features=16, classes=7):
        super().__init__()
        self.weight = nn.Linear(features, classes)

    def forward(self, x, adj):
        return adj @ self.weight(x)


def test_a_whole_graph_fed_as_one_batch_gets_no_batch_size_habit(tmp_path):
    """A graph of 2708 nodes is not a batch of 2708 rows: "batch_size=2704 or 2712" (the GPU's multiple-of-8 habit)
    changes nothing a script can set. A real batch of 2708 rows still gets it."""
    from test_static import context_for

    from turbotrain.doctor.rules import evaluate

    nodes = 2708
    dense = torch.eye(nodes)
    sparse = dense.to_sparse()
    edges = torch.randint(0, nodes, (2, 5429))
    gcn = GraphConvolution()
    for graph in (dense, sparse, edges):
        assert forward_facts(gcn, (torch.randn(nodes, 16), graph), None).whole_graph, graph.layout
    rows = forward_facts(nn.Linear(16, 7), (torch.randn(nodes, 16),), None)
    assert rows.batch_size == nodes and not rows.whole_graph
    # Two inputs of one batch (features and a mask of the same rows) are no graph either.
    assert not forward_facts(gcn, (torch.randn(nodes, 16), torch.ones(nodes, 16)), None).whole_graph

    graph_facts = forward_facts(gcn, (torch.randn(nodes, 16), sparse), None)
    for facts, expected in ((graph_facts, []), (rows, ["batch-size-not-multiple-of-8"])):
        ctx = context_for(tmp_path, "x = 1\n", facts=facts)
        assert [f.rule for f in evaluate(ctx, only=["batch-size-not-multiple-of-8"])] == expected
