"""L-BFGS with a closure: several forward/backward passes inside each optimizer step."""
import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(512, 16)
y = x @ torch.randn(16, 1) + 0.1 * torch.randn(512, 1)
model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=10)

for step in range(300):
    def closure():
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss
    optimizer.step(closure)
