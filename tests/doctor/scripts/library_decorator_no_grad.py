"""Library code judged by how it is called: an installed package's eval decorator (stacked under no_grad, as
x-transformers' is), the same pattern written in the script, and validation under torch.no_grad() are no
finding; the one call the script makes with autograd on (a library helper) is, at the script's own line."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "site-packages"))
import evallib  # the installed package, found in site-packages

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
wrapper = evallib.Wrapper(net)
data = torch.randn(512, 64)


def eval_decorator(fn):  # the same habit in the user's own code: always under @torch.no_grad() below
    def inner(model, *args):
        was_training = model.training
        model.eval()
        out = fn(model, *args)
        model.train(was_training)
        return out

    return inner


@torch.no_grad()
@eval_decorator
def sample(model, x):
    return model(x)


for step in range(400):
    x = data[torch.randint(0, len(data), (32,))]
    loss = (net(x) - x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        wrapper.generate(x[:4])
    sample(net, x[:4])
    check = evallib.score(net, x[:8])  # doctor: grad-in-validation
