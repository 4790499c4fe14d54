"""Adam with foreach=False over hundreds of small parameter tensors: one tiny kernel per tensor."""
import torch
from torch import nn


class ManyTables(nn.Module):
    def __init__(self, n=400, dim=32):
        super().__init__()
        self.rows = nn.ParameterList(nn.Parameter(torch.randn(dim) * 0.1) for _ in range(n))
        self.head = nn.Linear(n, 1)

    def forward(self, x):
        weight = torch.stack(tuple(self.rows))
        return self.head(x @ weight.t())


torch.manual_seed(0)
model = ManyTables()
opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)  # doctor: non-foreach-optimizer
x, y = torch.randn(256, 32), torch.randn(256, 1)
for step in range(300):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
