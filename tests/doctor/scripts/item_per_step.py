"""Host syncs every step: .item() for a history, an f-string of a tensor, and an `if` on a tensor."""
import torch
from torch import nn


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.x = torch.randn(4096, 32)
        self.y = self.x[:, :1] * 2.0
        self.history = []

    def train_step(self, i):
        xb = self.x[i * 64 % 4096:][:64]
        yb = self.y[i * 64 % 4096:][:64]
        loss = ((self.model(xb) - yb) ** 2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.history.append(loss.item())  # doctor: host-sync-in-loop
        message = f"step {i} loss {loss:.4f}"  # doctor: host-sync-in-loop
        if loss < 1e-6:  # doctor: host-sync-in-loop
            print("converged", message)
        return loss

    def fit(self, steps=400):
        for i in range(steps):
            self.train_step(i)


if __name__ == "__main__":
    Trainer().fit()
