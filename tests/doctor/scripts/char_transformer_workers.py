"""A small character-level transformer with a DataLoader of 4 workers and pinned memory, on a small CPU."""
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

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
loader = DataLoader(Chars(), batch_size=BATCH, shuffle=True, num_workers=4, pin_memory=True)  # doctor: cpu-oversubscribed
for step, (x, y) in enumerate(loader):
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step == 2000:
        break
