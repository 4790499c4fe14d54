"""Batch size 1 from a DataLoader whose every sample costs real work to load (a per-sample, pure-Python
transform): a larger batch spreads the model's per-op overhead over more samples, not the loading."""
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class CostlySamples(Dataset):
    def __init__(self, n: int):
        self.x = torch.randn(n, 32)
        self.y = torch.randint(0, 4, (n,))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        checksum = 0
        for j in range(4000):  # stands in for decoding or tokenising one sample
            checksum = (checksum * 31 + j) % 1_000_003
        return self.x[i] + checksum * 0.0, self.y[i]


torch.manual_seed(0)
model = nn.Sequential(*[layer for _ in range(8) for layer in (nn.Linear(32, 32), nn.ReLU())], nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(CostlySamples(4000), batch_size=1, shuffle=True)  # doctor: small-batch

for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
