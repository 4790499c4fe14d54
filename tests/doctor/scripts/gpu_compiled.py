"""Written for a GPU (runs on the CPU too): a model compiled with Inductor whose blocks each read a Python
number with .item() in forward. Each .item() ends a graph and makes the host wait for the GPU, so a step runs
several small graphs with eager Python between them instead of one graph.
"""

import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"
width, batch = (1024, 512) if device == "cuda" else (64, 32)


class NormalisedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        h = self.down(torch.relu(self.up(x)))
        scale = h.norm().item()  # doctor: compile-graph-break
        return x + h / (scale + 1.0)


def main(steps=60):
    torch.manual_seed(0)
    model = nn.Sequential(*(NormalisedBlock() for _ in range(4)), nn.Linear(width, 10)).to(device)
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(8 * batch, width, device=device)
    labels = data[:, :10].argmax(1)
    for step in range(steps):
        i = step * batch % len(data)
        loss = nn.functional.cross_entropy(compiled(data[i : i + batch]), labels[i : i + batch])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
