"""The reference models, defined here (no torchvision on CPU-only machines)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "ResNetCNN", "ResNet50", "TinyMLP", "SmallConvNet"]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small decoder-only transformer (GPT-2 layout: pre-LN, tied embeddings, SDPA attention)."""

    def __init__(
        self,
        vocab_size: int = 256,
        seq_len: int = 128,
        dim: int = 128,
        layers: int = 2,
        heads: int = 4,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.seq_len = seq_len
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            bias = getattr(module, "bias", None)
            if bias is not None:
                nn.init.zeros_(bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6N + 12 * layers * dim * seq_len (PaLM appendix B)."""
        n = sum(p.numel() for p in self.parameters()) - self.pos.weight.numel()
        layers, dim = len(self.blocks), self.tok.embedding_dim
        return 6 * n + 12 * layers * dim * self.seq_len


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def shortcut(cin: int, cout: int, stride: int, bias: bool) -> nn.Sequential:
    """A residual block's skip path: identity, or a strided 1x1 conv + BatchNorm when the shape changes."""
    if stride == 1 and cin == cout:
        return nn.Sequential()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=bias), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        # bias=True before BatchNorm, as much user code has it (drop_conv_bias removes it exactly).
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=True)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=True)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = shortcut(cin, cout, stride, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.short(x))


class ResNetCNN(nn.Module):
    """A ResNet-style classifier: stem, three stages of basic blocks, global pool, linear head."""

    def __init__(self, num_classes: int = 10, width: int = 32, blocks: tuple[int, ...] = (1, 1, 1)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=True), nn.BatchNorm2d(width), nn.ReLU())
        stages, cin = [], width
        for i, n in enumerate(blocks):
            cout = width * 2**i
            for j in range(n):
                stages.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 reduce, 3x3 (carries the stride), 1x1 expand by 4."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int, bias: bool):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=bias)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=bias)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=bias)
        self.bn3 = nn.BatchNorm2d(cout)
        self.short = shortcut(cin, cout, stride, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + self.short(x))


class ResNet50(nn.Module):
    """ResNet-50 as torchvision lays it out (v1.5, 25.6M parameters, ~4.1 GFLOPs per 224x224 image).

    ``conv_bias=True`` (the default here) keeps a bias in every conv before its BatchNorm, as much
    user code has it; ``drop_conv_bias`` then turns it into the standard model exactly.
    """

    def __init__(self, num_classes: int = 1000, layers: tuple[int, ...] = (3, 4, 6, 3), conv_bias: bool = True):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=conv_bias), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        blocks, cin = [], 64
        for i, n in enumerate(layers):
            width = 64 * 2**i
            for j in range(n):
                blocks.append(Bottleneck(cin, width, 2 if (j == 0 and i > 0) else 1, conv_bias))
                cin = width * Bottleneck.expansion
        self.stages = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class TinyMLP(nn.Module):
    """A model so small that the training framework's own per-step cost shows."""

    def __init__(self, inputs: int = 32, hidden: int = 64, classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallConvNet(nn.Module):
    """Two strided convs and a linear head: so cheap that reading the samples, not the math, sets the pace."""

    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, 2, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, 2, 1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))
