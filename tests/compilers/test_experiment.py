"""The experiment matrix: the summary is a pure function of the history; a 1-cell matrix runs on tiny."""

import json

from compilers.experiment import markdown_table, run_matrix, summarize


def test_summarize_by_hand():
    history = [
        {"kind": "eval", "step": 0, "val_accuracy": 0.1},
        {"kind": "step", "step": 1},
        {"kind": "eval", "step": 2, "val_accuracy": 0.4},
        {"kind": "eval", "step": 4, "val_accuracy": 0.4},  # ties keep the earlier peak
        {"kind": "eval", "step": 6, "val_accuracy": 0.2},
    ]
    s = summarize(history, [{"kind": "cliff", "step": 6}, {"kind": "other"}])
    assert (s["initial_accuracy"], s["peak_accuracy"], s["peak_step"], s["final_accuracy"]) == (0.1, 0.4, 2, 0.2)
    assert s["cliff_events"] == 1
    assert summarize([], [])["peak_accuracy"] is None


def test_one_cell_matrix_on_tiny(tmp_path):
    config = dict(steps=1, examples_per_step=2, group_size=2, max_tokens=4, eval_every=0,
                  lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    results = run_matrix(workflows=["voting"], backends=["shared"], tasks=["arithmetic"], seeds=[0], model="tiny",
                         out_dir=tmp_path, config=config, val_size=2)
    assert len(results) == 1 and "error" not in results[0], results
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["workflow"] == "voting"
    assert "| arithmetic | voting | shared | 0 |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "curves.png").exists()


def test_markdown_table_reports_errors():
    table = markdown_table([{"task": "t", "workflow": "w", "backend": "b", "seed": 0, "error": "boom", "seconds": 1}])
    assert "error: boom" in table
