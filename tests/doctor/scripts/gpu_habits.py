"""Written for a GPU (runs on the CPU too): habits that only cost on a GPU.

Pageable loader memory, blocking copies, tensors made on the host then moved, empty_cache every
step, cudnn.benchmark left off for a conv net, TorchScript for a pointwise op.
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

device = "cuda" if torch.cuda.is_available() else "cpu"


@torch.jit.script  # doctor: jit-script
def fused_gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = fused_gelu(self.bn(self.conv1(x)))
        return self.head(fused_gelu(self.conv2(x)).mean((2, 3)))


data = TensorDataset(torch.randn(512, 3, 16, 16), torch.randint(0, 10, (512,)))
loader = DataLoader(data, batch_size=32, shuffle=True)  # doctor: pin-memory
model = Net().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(10):
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)  # doctor: non-blocking
        noise = torch.randn(images.shape).to(device)  # doctor: tensor-created-off-device
        loss = nn.functional.cross_entropy(model(images + 0.01 * noise), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.empty_cache()  # doctor: empty-cache-in-loop
