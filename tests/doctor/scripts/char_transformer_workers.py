"""A small character-level transformer with a DataLoader of 4 workers and pinned memory, on a small CPU.

``--workers N`` and ``--threads K`` make its fixed twin; ``--steps N`` times N steps after 5 of warm-up
and prints ``STEP_MS <median>`` (benchmarks/doctor_shared_machine.py reads it).
"""
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

def arg(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


WORKERS, THREADS, STEPS = arg("--workers", 4), arg("--threads", 0), arg("--steps", 2000)
if THREADS:
    torch.set_num_threads(THREADS)
torch.manual_seed(0)
TEXT = torch.randint(0, 65, (200_000,))
BLOCK, BATCH = 16, 32


class Chars(Dataset):
    def __len__(self):
        return len(TEXT) - BLOCK - 1

    def __getitem__(self, i):
        chunk = TEXT[i:i + BLOCK + 1]
        return chunk[:-1], chunk[1:]


class TinyGPT(nn.Module):
    def __init__(self, vocab=65, dim=64, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(BLOCK, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.blocks(self.embed(x) + self.pos, mask=mask, is_causal=True))


model = TinyGPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
loader = DataLoader(Chars(), batch_size=BATCH, shuffle=True, num_workers=WORKERS, pin_memory=True)  # doctor: cpu-oversubscribed
times = []
started = time.perf_counter()
for step, (x, y) in enumerate(loader):
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    now = time.perf_counter()
    times.append(now - started)
    started = now
    if step + 1 == STEPS + 5:
        break
if "--steps" in sys.argv:
    print(f"STEP_MS {statistics.median(times[5:]) * 1e3:.3f}")
