"""Written for a GPU (runs on the CPU too): the step waits for data.

Every sample is decoded and augmented on the host in Python/NumPy (a slow read, a random crop, a flip,
normalisation) by the training process itself (num_workers=0), while a small conv net on the GPU
finishes its step in a fraction of that time.
"""
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

device = "cuda" if torch.cuda.is_available() else "cpu"


class DecodedImages(Dataset):
    def __init__(self, n=4096):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.0003)  # one file read from storage
        rng = np.random.default_rng(i)
        image = rng.integers(0, 256, size=(40, 40, 3), dtype=np.uint8)  # the "decoded" JPEG
        top, left = rng.integers(0, 9, size=2)
        crop = image[top:top + 32, left:left + 32]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        x = (crop.astype(np.float32) / 255.0 - 0.5) / 0.25
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))), i % 10


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU())
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


def main(steps=120):
    torch.manual_seed(0)
    model = Net().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(DecodedImages(), batch_size=64, shuffle=True)  # doctor: num-workers
    step = 0
    while step < steps:
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            loss = nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == steps:
                break


if __name__ == "__main__":
    main()
