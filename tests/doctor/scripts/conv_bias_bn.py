"""A CNN whose convolutions carry a bias right before BatchNorm (which cancels it)."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)  # doctor: conv-bias-before-bn
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1024, 3, 16, 16), torch.randint(0, 10, (1024,)))
    loader = DataLoader(data, batch_size=32, shuffle=True, drop_last=True)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(5):
        for images, labels in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(images), labels).backward()
            opt.step()


if __name__ == "__main__":
    main()
