"""Calibration pair memory_ckpt: two wide blocks whose activations (72 MiB tensors) hold most of the step's peak.

slow: each block's activations kept for the backward; fixed: each block recomputed in the backward
(torch.utils.checkpoint), as activation-memory's checkpointing fix measures it.
"""
# calibrates: activation-memory
# memory-fix: checkpointing
# doctor-args: --what-if-budget 120
# expect: peak lower by about one block's activations, the step slower by one forward of the blocks
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from calib_clock import steps_from_argv, timed_steps
from memory_blocks import Net as TwoBlocks


class Net(TwoBlocks):
    """memory_blocks.Net, its forward here: the line the fix changes."""

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


steps = steps_from_argv(20)
torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(2048, 64), torch.randint(0, 10, (2048,))
for step in timed_steps(steps, warmup=3, samples=len(x)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
