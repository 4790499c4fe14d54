"""Written for a GPU (runs on the CPU too): the step waits on host syncs.

Wide layers keep the GPU busy for several milliseconds a step, as long as the host queues the next
step's kernels ahead; reading the loss every step (.item(), an f-string, an `if` on a tensor) and
boolean masking make the host wait for the GPU instead, so the host's own time is exposed every step.
"""
import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"
width, batch = (2048, 512) if device == "cuda" else (256, 256)


def main(steps=300):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8192, width, device=device)
    y = x[:, :10].argmax(1)
    history = []
    for step in range(steps):
        i = step * batch % 8192
        xb, yb = x[i:i + batch], y[i:i + batch]
        per_sample = nn.functional.cross_entropy(model(xb), yb, reduction="none")
        hard = per_sample[per_sample > per_sample.mean()]  # doctor: host-sync-in-loop
        loss = per_sample.mean() + 0.1 * hard.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.item())  # doctor: host-sync-in-loop
        line = f"step {step} loss {loss:.4f}"  # doctor: host-sync-in-loop
        if loss < 1e-4:  # doctor: host-sync-in-loop
            print("converged", line)
            break
        if step % 100 == 0:
            print(line)


if __name__ == "__main__":
    main()
