"""DDP on gloo with two habits written as literals, so ``doctor --fix`` can edit them: every rank sizes torch's
threads to 4 (two ranks on this 2-core machine run 8), and DDP looks for unused parameters there are none of."""
import gc

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

torch.set_num_threads(4)  # doctor: cpu-oversubscribed
dist.init_process_group("gloo")
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
model = DistributedDataParallel(net, find_unused_parameters=True)  # doctor: ddp-find-unused-parameters
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(64, 256), torch.randn(64, 1)) for _ in range(16)]

for step in range(300):
    x, y = data[step % len(data)]
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
# DDP holds the group in a reference cycle: free it first, so that destroying the group joins gloo's threads
# now, not during interpreter shutdown, where they can abort the process (docs/launch.md, known issues).
del model
gc.collect()
dist.destroy_process_group()
