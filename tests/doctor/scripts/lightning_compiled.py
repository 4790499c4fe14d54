"""A LightningModule handed to the Trainer compiled: Lightning compiles its ``training_step``, so the model's
modules run only inside that graph, where no module hook fires. The doctor must still find the model (a warm-up
step run eagerly), time the optimizer's switch on it and price the compile at ``training_step``'s line."""

import lightning as L
import torch
from torch import nn


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        layers = [m for _ in range(8) for m in (nn.Linear(64, 64), nn.GELU())]
        self.body = nn.Sequential(*layers, nn.Linear(64, 10))  # 18 parameter tensors

    def training_step(self, batch, batch_idx):  # doctor: compile-pays-back
        x, y = batch
        return nn.functional.cross_entropy(self.body(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, foreach=False)  # doctor: non-foreach-optimizer


if __name__ == "__main__":
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    L.Trainer(max_epochs=2, accelerator="cpu", enable_progress_bar=False, logger=False, enable_checkpointing=False,
              enable_model_summary=False).fit(torch.compile(Classifier()), loader)
