"""What limits GPT-2 124M's MFU on a GPU: the loss inside or outside torch.compile, the batch size; a profile.

A plain loop (bf16 autocast, TF32, fused AdamW, torch.compile) on the bench's GPT-2 small, so the
numbers say what the model can reach without turbotrain in the way, and the attention kernels alone
(each SDPA backend, forward and backward, at GPT-2's shape). CUDA only; the default run is about
2 minutes on an H100; `make gpu-check` runs the short one (`--short`: batch 64 and the attention).

    python benchmarks/gpu_gpt_probe.py [--short]
"""
import argparse
import statistics
import time
import torch
import torch.nn.functional as F
from turbotrain.bench.models import GPT
from turbotrain.bench.peaks import peak_bf16_flops

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
dev = "cuda"
cfg = dict(seq_len=1024, dim=768, layers=12, heads=12, vocab_size=50304)


def run(batch, loss_in_compile, steps=20, warm=4, profile=False, mode=None):
    peak = peak_bf16_flops(torch.cuda.get_device_name(0))
    torch.manual_seed(0)
    model = GPT(**cfg).to(dev)
    fpt = model.flops_per_token()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def fwd_loss(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))

    if loss_in_compile:
        step_fn = torch.compile(fwd_loss, mode=mode)
    else:
        cm = torch.compile(model, mode=mode)

        def step_fn(x, y):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = cm(x)
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
    x = torch.randint(0, 50257, (batch, 1024), device=dev)
    y = torch.randint(0, 50257, (batch, 1024), device=dev)
    t0 = time.perf_counter()
    for i in range(warm + steps):
        if i == warm:
            torch.cuda.synchronize()
            warm_s = time.perf_counter() - t0
            t0 = time.perf_counter()
        loss = step_fn(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    tps = batch * 1024 / dt
    print(f"batch {batch:3d} loss_in_compile={loss_in_compile} mode={mode}: {dt*1e3:7.2f} ms/step "
          f"{tps:10,.0f} tok/s MFU {tps*fpt/peak:6.1%} (warm-up {warm_s:.0f} s, peak mem "
          f"{torch.cuda.max_memory_allocated()/2**30:.1f} GiB)", flush=True)
    if profile:
        from torch.profiler import ProfilerActivity, profile as prof
        with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(3):
                loss = step_fn(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=70), flush=True)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def attention(batch=16, heads=12, seq=1024, head_dim=64, reps=20):
    """Each SDPA backend's causal forward + backward at GPT-2's shape: ms and TFLOP/s (causal: half the square)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    flops = 4 * batch * heads * seq * seq * head_dim / 2 * 3.5  # forward 1, backward 2.5
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device=dev, dtype=torch.bfloat16, generator=g)
               .requires_grad_() for _ in range(3))
    grad = torch.randn_like(q)
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                def step():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
                for _ in range(3):
                    step()
                times = []
                for _ in range(reps):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    step()
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end))
            ms = statistics.median(times)
            print(f"attention {backend.name:20s} fwd+bwd {ms:7.3f} ms  {flops / ms / 1e9:6.0f} TFLOP/s "
                  f"(batch {batch}, {heads} heads, {seq} tokens, head dim {head_dim})", flush=True)
        except RuntimeError as exc:
            print(f"attention {backend.name:20s} not available: {str(exc).splitlines()[0]}", flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("gpu_gpt_probe.py needs a CUDA device")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="batch 64 with the loss compiled, and the attention")
    short = parser.parse_args().short
    attention()
    for args in [(64, True)] if short else [(16, False), (16, True), (32, True), (64, True)]:
        run(*args, profile=(args == (64, True)))
