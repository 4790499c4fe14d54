from rich.console import Console

from turbotrain.demo import run_demo


def test_demo_trains_naive_and_fast_and_both_learn():
    console = Console(record=True, width=140)
    rows = run_demo(("mlp",), steps=30, console=console)
    assert [(r.workload, r.plan_name) for r in rows] == [("mlp", "naive"), ("mlp", "fast")]
    for row in rows:
        assert row.throughput > 0 and row.final_loss < row.first_loss
    text = console.export_text()
    assert "speed-up" in text and "1.00x" in text


def test_demo_tunes_then_trains_the_tuned_plan():
    """With a budget the demo runs tt.tune on the workload and trains its plan as a third run."""
    console = Console(record=True, width=160)
    rows = run_demo(("mlp",), steps=20, console=console, tune_budget_s=20)
    assert [r.plan_name for r in rows] == ["naive", "fast", "tuned"]
    tuned = rows[-1]
    assert tuned.throughput > 0 and tuned.final_loss < tuned.first_loss
    text = console.export_text()
    assert "tuned in" in text and "x naive in its own trials" in text and "naive vs fast vs tuned plan" in text


def test_demo_diagnoses_the_plain_loop_first():
    """doctor -> train: the plain loop of the workload is diagnosed before it is trained."""
    console = Console(record=True, width=160)
    rows = run_demo(("mlp",), steps=20, console=console, diagnose=True)
    assert [r.plan_name for r in rows] == ["naive", "fast"]
    text = console.export_text()
    assert "mlp  doctor: a plain loop takes" in text and "bottleneck: " in text
    assert text.index("doctor:") < text.index("mlp  naive")
