"""An RNN language model in the classic style: [seq, batch] tensors, weights updated by hand (no torch
optimizer), hidden state carried between chunks, and an ONNX export function that never runs."""
import math
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
BPTT, BATCH, VOCAB = 35, 20, 64
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 400


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp=32, nhid=48, nlayers=2):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers)          # batch_first=False: inputs are [seq, batch]
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(out).view(-1, self.decoder.out_features), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[:nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source, i):
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


def evaluate(model, source):
    model.eval()
    total, hidden = 0.0, model.init_hidden(BATCH)
    with torch.no_grad():
        for i in range(0, min(source.size(0) - 1, 4 * BPTT), BPTT):
            data, targets = get_batch(source, i)
            output, hidden = model(data, hidden)
            total += len(data) * nn.functional.cross_entropy(output, targets).item()
    return total / min(source.size(0) - 1, 4 * BPTT)


def export_onnx(model, path):
    model.eval()
    dummy = torch.zeros(BPTT, 1, dtype=torch.long)
    torch.onnx.export(model, (dummy, model.init_hidden(1)), path)


corpus = torch.randint(0, VOCAB, (BATCH * BPTT * 40,))
train_data = batchify(corpus, BATCH)
val_data = batchify(corpus[: BATCH * BPTT * 5], BATCH)
model = RNNModel(VOCAB)
criterion = nn.CrossEntropyLoss()
lr = 5.0
done = 0
while done < steps:
    model.train()
    hidden = model.init_hidden(BATCH)
    for i in range(0, train_data.size(0) - 1, BPTT):
        data, targets = get_batch(train_data, i)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        done += 1
        if done >= steps:
            break
    print(f"val ppl {math.exp(min(evaluate(model, val_data), 20)):.1f}")
if "--export" in sys.argv:
    export_onnx(model, "model.onnx")
