"""A well-written CPU training script: the doctor must not raise a high or medium finding that this CPU does not
back. ``--precision bf16`` and ``--time-steps N`` are the test's knobs: the same loop under bf16 autocast, and a plain
timer (one line, ``ms_per_step=...``) so a finding's gain can be checked by an independent run of the script."""
import argparse
import contextlib
import time

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=g)
    return TensorDataset(x, (x[:, :8].sum(1) > 0).long())


def batches(dataset, batch_size, shuffle):
    """In-memory tensors sliced a whole batch at a time: no per-sample indexing and collation."""
    sampler = (RandomSampler if shuffle else SequentialSampler)(dataset)
    return DataLoader(dataset, batch_size=None, sampler=BatchSampler(sampler, batch_size, drop_last=shuffle))


def evaluate(model, loader):
    model.eval()
    correct = torch.zeros((), dtype=torch.long)
    with torch.inference_mode():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum()
    model.train()
    return correct.item() / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--time-steps", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    train = batches(make_data(8192, 0), 128, shuffle=True)
    val = batches(make_data(1024, 1), 256, shuffle=False)
    # 128 wide, not 256: there bf16 bought x1.03-1.14 on an avx512_bf16 EPYC, astride the medium bar, so the doctor's
    # rating and the twin's timing fell on either side of it by turns; here it costs (x0.8 on that CPU).
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    running = torch.zeros(())
    step = 0

    def autocast():
        if args.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    started = None
    for epoch in range(20):
        for x, y in train:
            if args.time_steps and step == 20:
                started = time.perf_counter()
            if args.time_steps and step == 20 + args.time_steps:
                print(f"ms_per_step={(time.perf_counter() - started) * 1e3 / args.time_steps:.4f}")
                return
            with autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            running += loss.detach()
            step += 1
            if step % 100 == 0 and not args.time_steps:
                print(f"step {step}: loss {running.item() / 100:.4f}, val acc {evaluate(model, val):.3f}")
                running.zero_()


if __name__ == "__main__":
    main()
