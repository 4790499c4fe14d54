"""Self-attention written by hand (matmul, mask, softmax, matmul) over long sequences: no SDPA."""
import math

import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"


class CausalSelfAttention(nn.Module):
    def __init__(self, dim=32, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)  # doctor: manual-attention
        y = (weights @ v).transpose(1, 2).reshape(b, t, d)
        return self.out(y)


torch.manual_seed(0)
model = nn.Sequential(nn.LayerNorm(32), CausalSelfAttention(), nn.Linear(32, 32)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
data = torch.randn(32, 512, 32, device=device)
for step in range(200):
    x = data[torch.randint(0, 32, (2,))]
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
