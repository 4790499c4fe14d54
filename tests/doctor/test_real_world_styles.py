"""Scripts in the styles public training code is written in: no optimizer, closures, [seq, batch] RNNs,
periodic validation, the Hugging Face Trainer. Each asserts the bottleneck, the rule and the line."""

from __future__ import annotations

import pytest

from doctor_helpers import cached_report, marked_lines, run_doctor

pytestmark = pytest.mark.one_core  # one process, one thread: run beside one other such test (tests/conftest.py)


def test_manual_sgd_without_an_optimizer_is_measured_by_its_backward():
    report = cached_report("rnn_lm_manual_sgd")
    data = report.to_dict()
    assert report.status == "ok" and data["step_delimiter"] == "loss.backward()"
    assert data["steps_measured"] >= 4 and report.run.status == "stopped"   # ended after its budget, not its epochs
    # The hand-written update (p.data.add_) is the optimizer phase of a backward-delimited step, and the
    # model, not the update, is what the step waits on. This small RNN's forward and backward are about half
    # per-op dispatch (python_overhead), half arithmetic (compute): which of the two leads is the measurement's
    # to say, and the bottleneck must be the larger one.
    shares = data["breakdown"]
    assert data["breakdown_ms"]["optimizer"] > 0
    assert shares["compute"] + shares["python_overhead"] > 0.5 > shares["optimizer"], shares
    assert report.bottleneck == max(("compute", "python_overhead"), key=shares.get), shares


def test_an_rnn_fed_seq_batch_reads_the_batch_from_dim_1():
    report = cached_report("rnn_lm_manual_sgd")
    found = [f for f in report.findings if f.rule == "batch-size-not-multiple-of-8"]
    assert found and found[0].evidence.batch_size == 20   # not the sequence length, 35


def test_a_function_that_never_ran_gets_no_serious_finding():
    """export_onnx() calls model.eval() with autograd on, but the run never calls export_onnx."""
    report = cached_report("rnn_lm_manual_sgd")
    eval_lines = [f for f in report.findings if f.rule == "grad-in-validation"]
    assert all(f.severity == "low" and f.ran is False for f in eval_lines), \
        [f.to_dict() for f in eval_lines]


def test_lbfgs_with_a_closure_is_one_step_per_optimizer_step():
    report = cached_report("lbfgs_closure")
    data = report.to_dict()
    assert report.status == "ok" and data["step_delimiter"] == "optimizer.step()"
    # Several forward/backward passes run inside each step, timed as compute inside the optimizer call.
    assert report.breakdown.seconds["compute"] > 0 and report.breakdown.seconds["optimizer"] > 0


@pytest.mark.parametrize("steps", [20, 25, 30])
def test_periodic_validation_names_the_same_bottleneck_whatever_the_window(steps):
    report = run_doctor("periodic_validation", steps=steps, warmup=3, what_if_budget_s=4.0)
    assert report.bottleneck == "outside_step", report.breakdown.shares
    rows = report.to_dict()["periodic"]
    assert [r["every"] for r in rows] == [20] and rows[0]["kind"] == "validation"
    assert rows[0]["suggested_every"] > 20 and rows[0]["share"] > 0.05
    finding = next(f for f in report.findings if f.rule == "periodic-work")
    (rule, line), = marked_lines("periodic_validation")
    assert finding.to_dict(report.base)["where"] == f"periodic_validation.py:{line}"
    assert f"every {rows[0]['suggested_every']} steps" in finding.fix.pytorch


def test_torch_tensor_of_a_python_list_is_not_a_numpy_copy():
    report = cached_report("tensor_from_list")
    assert report.status == "ok"
    assert "tensor-from-numpy-copy" not in report.rules(), [f.to_dict() for f in report.findings]


def test_a_hugging_face_trainer_on_a_tiny_gpt2():
    pytest.importorskip("transformers", reason="transformers is in the test extra: pip install -e '.[test]'")
    report = cached_report("hf_trainer_tiny_gpt2")
    data = report.to_dict()
    assert report.status == "ok" and data["steps_measured"] >= 4, report.messages
    assert report.bottleneck == "compute", report.breakdown.shares
    # The model is called with keyword arguments (model(**batch)): the what-ifs can re-run it.
    precision = [f for f in report.findings if f.rule == "no-mixed-precision"]
    assert not precision or precision[0].measured, precision[0].to_dict()
    for f in data["findings"]:
        assert f["where"] is None or f["where"].startswith("hf_trainer_tiny_gpt2.py"), f


def test_what_ifs_rebuild_the_scripts_own_optimizer():
    """torch's AdamW keeps a default its constructor does not take; the rebuild must still be an AdamW
    with the script's settings (it silently fell back to SGD before)."""
    import torch

    from turbotrain.doctor.whatif.common import constructor_defaults

    opt = torch.optim.AdamW([torch.zeros(3, requires_grad=True)], lr=3e-4, amsgrad=True, foreach=False)
    rebuilt = torch.optim.AdamW([torch.zeros(3, requires_grad=True)], **constructor_defaults(opt))
    assert rebuilt.defaults["amsgrad"] is True and rebuilt.defaults["foreach"] is False
    assert rebuilt.defaults["lr"] == 3e-4
