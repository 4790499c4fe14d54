"""Calibration pair attention: a two-layer causal transformer whose attention is written by hand
(matmul, mask, softmax, matmul) over 128 tokens.

slow: the hand-written attention; fixed: torch.nn.functional.scaled_dot_product_attention.
"""
# calibrates: manual-attention
# expect: measured (the fused CPU kernel never writes the 128x128 score matrix)
import torch
from torch import nn
from torch.nn import functional as F

from calib_clock import steps_from_argv, timed_steps

SEQ, DIM, HEADS = 128, 128, 4


def attend(q, k, v):
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        x = x + self.proj(attend(q, k, v).transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.norm2(x))


steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(256, DIM), Block(), Block(), nn.Linear(DIM, 256))
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
tokens = torch.randint(0, 256, (4, SEQ + 1))
for step in timed_steps(steps, samples=len(tokens)):
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, 256), tokens[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
