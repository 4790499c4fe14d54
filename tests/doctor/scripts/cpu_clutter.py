"""Low findings that cannot matter here: a float64 character model (a 65-token vocabulary, so two matrix
dimensions are not multiples of 8) trained on all 1004 samples at once (the "batch" is the data set) on the CPU."""
import torch
from torch import nn

torch.manual_seed(0)
VOCAB, N = 65, 1004
x = torch.randint(0, VOCAB, (N,))
y = torch.randint(0, VOCAB, (N,))
embed, head = nn.Embedding(VOCAB, 72), nn.Linear(72, VOCAB)  # doctor: dims-not-multiple-of-8
model = nn.Sequential(embed, nn.Linear(72, 72), nn.Tanh(), head).double()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(400):
    loss = nn.functional.cross_entropy(model(x), y)  # doctor: batch-size-not-multiple-of-8
    opt.zero_grad()
    loss.backward()
    opt.step()
