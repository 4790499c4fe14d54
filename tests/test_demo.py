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
