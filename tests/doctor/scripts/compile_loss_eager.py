"""A compiled classifier whose loss is left outside the compiled graph: torch.compile(model) compiles the model
alone, and the cross-entropy over its 2,000 classes runs eagerly after it, op by op, forward and backward.
Compiling the model and the loss as one lets the compiler fuse the loss with the model's last ops. AOT autograd's
graph without Inductor's code generation keeps the corpus run short; benchmarks/calibration's compile_loss pair
times the same habit under Inductor."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--backend", default="aot_eager")
parser.add_argument("--together", action="store_true", help="the fixed twin: the loss compiled with the model")
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 2000))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x = torch.randn(256, 64)
y = torch.randint(0, 2000, (256,))

if args.together:
    step_loss = torch.compile(lambda x, y: F.cross_entropy(model(x), y), backend=args.backend)
else:
    compiled = torch.compile(model, backend=args.backend)

    def step_loss(x, y):
        return F.cross_entropy(compiled(x), y)  # doctor: compile-loss-eager


for step in range(args.steps):
    loss = step_loss(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
