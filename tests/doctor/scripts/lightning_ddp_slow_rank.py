"""A Lightning Trainer on DDP that starts its own second rank (`python train.py`, no launcher): rank 1 reads
its data slower, as if its shard sat on a slower disk, and rank 0 waits for it at every all-reduce."""
import os
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Shard(Dataset):
    reads = 0

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        Shard.reads += 1  # Lightning's DistributedSampler shuffles the indices: count reads instead
        if os.environ.get("LOCAL_RANK") == "1" and Shard.reads % 64 == 0:
            time.sleep(0.025)  # rank 1's storage
        return torch.randn(128), torch.randn(1)


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    torch.manual_seed(0)
    loader = DataLoader(Shard(), batch_size=64)  # doctor: straggler
    L.Trainer(max_steps=300, accelerator="cpu", devices=2, strategy="ddp", enable_progress_bar=False, logger=False,
              enable_checkpointing=False, enable_model_summary=False).fit(Regressor(), loader)
