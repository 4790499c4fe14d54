"""A Lightning script whose Dataset reads slowly with num_workers=0: the loop is Lightning's, the problem is the same."""
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowReads(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(0.0005)  # one file read from slow storage
        x = torch.full((32,), float(i % 7))
        return x, x[:1]


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    loader = DataLoader(SlowReads(), batch_size=32, shuffle=True)  # doctor: num-workers
    L.Trainer(max_epochs=2, accelerator="cpu", enable_progress_bar=False, logger=False, enable_checkpointing=False,
              enable_model_summary=False).fit(Regressor(), loader)
