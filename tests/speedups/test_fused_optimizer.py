import torch
from tiny import make_mlp

import turbotrain as tt
from turbotrain.speedups.fused_optimizer import make_fused


def _step(opt, model):
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_adamw_becomes_fused_in_place_and_computes_the_same_update():
    a, b = make_mlp(), make_mlp()
    opt_a, opt_b = torch.optim.AdamW(a.parameters(), lr=0.01), torch.optim.AdamW(b.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt_b, 1)
    rt = tt.prepare(b, opt_b, tt.Plan(device="cpu", fused_optimizer=True))
    assert rt.optimizers[0] is opt_b and sched.optimizer is opt_b
    assert all(g["fused"] and not g["foreach"] for g in opt_b.param_groups)
    for _ in range(3):
        _step(opt_a, a)
        _step(opt_b, b)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_optimizer_without_fused_kernel_gets_foreach():
    opt = torch.optim.RMSprop(make_mlp().parameters())
    assert make_fused(opt) == "foreach"
    assert opt.param_groups[0]["foreach"] is True


def test_fused_kernel_is_what_runs(monkeypatch):
    model = make_mlp()
    opt = torch.optim.Adam(model.parameters())
    make_fused(opt)
    called = []
    real = torch._fused_adam_
    monkeypatch.setattr(torch, "_fused_adam_", lambda *a, **k: called.append(1) or real(*a, **k))
    _step(opt, model)
    assert called


def test_implementation_reads_what_step_runs_and_make_fused_changes_it():
    from turbotrain.speedups.fused_optimizer import best_implementation, implementation, takes_found_inf

    loop = torch.optim.AdamW(make_mlp().parameters(), foreach=False)
    assert implementation(loop) == "for-loop" and not takes_found_inf(loop)
    assert best_implementation(loop) == "fused"
    assert implementation(loop) == "for-loop"          # asking changes nothing
    assert make_fused(loop) == "fused"
    assert implementation(loop) == "fused" and takes_found_inf(loop)

    built_fused = torch.optim.AdamW(make_mlp().parameters(), fused=True)
    assert implementation(built_fused) == "fused" and takes_found_inf(built_fused)

    rms = torch.optim.RMSprop(make_mlp().parameters(), foreach=False)
    assert best_implementation(rms) == "foreach" and make_fused(rms) == "foreach"
    assert implementation(rms) == "foreach" and not takes_found_inf(rms)   # foreach kernels take no found_inf


def test_differentiable_optimizers_are_left_alone():
    from turbotrain.speedups.fused_optimizer import best_implementation

    opt = torch.optim.SGD(make_mlp().parameters(), lr=0.1, differentiable=True)
    assert best_implementation(opt) == "none" and make_fused(opt) == "none"
    assert not opt.param_groups[0].get("fused") and not opt.param_groups[0].get("foreach")
