"""compilers.suite_report on hand-made records and rows: per-role rewards over the training steps, the t-interval
over seeds, the per-task summary with the issue's bars, and the markdown table (skipped and failed rows listed)."""

from __future__ import annotations

import pytest

from compilers.suite_report import (markdown_table, remedy_figures, remedy_table, role_pass_rates, seed_interval,
                                     suite_gain, summarize)


def test_role_pass_rates_from_step_records():
    log = [{"kind": "plan"}, {"kind": "eval", "roles": {"x": {}}},
           {"kind": "step", "roles": {"voter": {"reward_mean": 0.2, "calls": 6}, "aggregator":
                                      {"reward_mean": 0.5, "calls": 2}}},
           {"kind": "step", "roles": {}},  # a step that kept nothing
           {"kind": "step", "roles": {"voter": {"reward_mean": 0.6, "calls": 2}}}]
    rates = role_pass_rates(log)
    assert rates["voter"] == {"first": 0.2, "last": 0.6, "steps": 2, "mean": pytest.approx((1.2 + 1.2) / 8)}
    assert rates["aggregator"] == {"first": 0.5, "last": 0.5, "steps": 1, "mean": 0.5}
    assert role_pass_rates([{"kind": "plan"}]) == {}


def test_seed_interval():
    assert seed_interval([0.3]) == (0.3, 0.3, 0.3)
    mean, low, high = seed_interval([0.1, 0.2, 0.3])  # sd 0.1, t(2) = 4.303: half = 4.303 * 0.1 / sqrt(3)
    assert (mean, high - mean, mean - low) == pytest.approx((0.2, 0.24844, 0.24844), abs=1e-5)


def row(task, seed, base, compiled, pass_k, minutes=2.0, tokens=1000):
    return {"task": task, "seed": seed, "shape": f"{task} shape",
            "base": {"accuracy": base, "interval": [max(base - 0.1, 0), base + 0.1]},
            "compiled": {"accuracy": compiled, "interval": [compiled - 0.1, compiled + 0.1]},
            "sampled": {"k": 16, "pass@1": base, "pass@k": pass_k}, "gain": compiled - base,
            "roles": {"self": {"first": 0.1, "last": 0.4}}, "minutes": {"compile": minutes}, "rollout_tokens": tokens}


ROWS = [row("demo", 0, 0.2, 0.7, 0.9), row("demo", 1, 0.2, 0.8, 0.9, minutes=4.0, tokens=3000),
        row("hard", 0, 0.0, 0.02, 0.05), row("hard", 1, 0.0, 0.0, 0.07),
        row("mid", 0, 0.3, 0.35, 0.5), {"task": "gsm8k", "seed": 0, "skipped": "no data"},
        {"task": "mid", "seed": 1, "error": "RuntimeError: boom"}]


def test_summary_applies_the_bars():
    s = summarize(ROWS)
    assert list(s) == ["demo", "hard", "mid"]
    assert s["demo"]["gain"][0] == pytest.approx(0.55) and s["demo"]["seeds"] == [0, 1]
    assert (s["demo"]["minutes"], s["demo"]["rollout_tokens"]) == (3.0, 2000)
    assert (s["demo"]["weak"], s["demo"]["meets"]) == (False, True)
    assert s["hard"]["weak"] and not s["hard"]["meets"]  # pass@16 6%: the +10 bar does not apply
    assert (s["mid"]["weak"], s["mid"]["meets"], s["mid"]["seeds"]) == (False, False, [0])
    # per seed: seed 0 (0.5 + 0.02 + 0.05) / 3 = 0.19, seed 1 (0.6 + 0.0) / 2 = 0.3
    assert suite_gain(ROWS)[0] == pytest.approx((0.19 + 0.3) / 2)
    assert suite_gain(ROWS[-2:]) is None


def test_markdown_table():
    text = markdown_table(ROWS)
    lines = text.splitlines()
    assert lines[0].startswith("| task | program | base | pass@16 | compiled | gain [95% CI] |")
    assert "| demo | demo shape | 20.0 | 90.0 | 75.0 | +55.0 [" in text and "| 0,1 | yes | 3.0 | 2,000 |" in text
    assert "| hard | hard shape | 0.0 | 6.0 | 1.0 | +1.0 [" in text and "n/a (weak base)" in text
    assert "| mid | mid shape | 30.0 | 50.0 | 35.0 | +5.0 [+5.0, +5.0] | 0 | no |" in text
    assert "Suite average gain: +24.5 [" in text and "over 3 tasks (meets the +20 bar)" in text
    assert "| demo | 1 | 20.0 [10.0, 30.0] | - | 20.0 | 90.0 | 80.0 [70.0, 90.0] | +60.0 | self 10.0->40.0 | 4.0 | " \
           "3,000 |" in text  # a row written before the constant-answer bar was measured shows '-'
    with_bar = markdown_table([{**ROWS[0], "constant": {"labels": {"answer": "2"}, "accuracy": 0.065}}])
    assert "| 20.0 [10.0, 30.0] | 6.5 | 20.0 | 90.0 |" in with_bar
    seeds = [line.split(" | ")[0:2] for line in lines if line.startswith("| ") and line.split(" | ")[1].isdigit()]
    assert seeds == [["| demo", "0"], ["| demo", "1"], ["| hard", "0"], ["| hard", "1"], ["| mid", "0"]]
    assert lines[-2:] == ["- gsm8k seed 0: skipped: no data", "- mid seed 1: failed: RuntimeError: boom"]
    assert markdown_table([]).startswith("| task |")
    listed = markdown_table(ROWS, tasks=["demo", "agent", "gsm8k", "code"]).splitlines()
    assert listed[-2:] == ["- agent: not run", "- code: not run"]  # gsm8k has its skipped row above


def test_remedy_figures_and_table():
    def step(flat, drawn):
        return {"kind": "step", "starvation": {"flat": flat, "drawn": drawn}}
    log = [{"kind": "probe", "pass_rate": 0.0125}, {"kind": "warm_start", "passing_runs": 3, "runs": 300},
           step(4, 4), step(3, 4), step(0, 0), step(1, 4)]
    fig = remedy_figures({**row("multistep", 0, 0.0, 0.06, 0.12), "best_step": 5}, log)
    assert (fig["steps"], fig["signal_steps"], fig["warm_passing"], fig["probe_pass_rate"]) == (4, 2, "3/300", 0.0125)
    assert (fig["compiled"], fig["gain"], fig["rollout_tokens"], fig["minutes"]) == (0.06, 0.06, 1000, 2.0)
    plain = remedy_figures(row("multistep", 1, 0.0, 0.02, 0.12), [step(4, 4)])
    assert (plain["warm_passing"], plain["probe_pass_rate"], plain["signal_steps"]) == (None, None, 0)
    text = remedy_table({"none": ("default", [plain]), "together": ("warm_start_runs=1", [fig, plain]),
                         "dynamic": ("dynamic_sampling=true", [])})
    lines = text.splitlines()
    assert lines[2].startswith("| none | default | 1 | 2.0 | +2.0 [+2.0, +2.0] | 0/1 | 1,000 | - | - | - | 2.0 |")
    assert lines[3].startswith("| together | warm_start_runs=1 | 2 | 4.0 | +4.0 [") and "| 2/4 / 0/1 |" in lines[3]
    assert "| 3/300 / - | 0.013 / - | 5 / - |" in lines[3]
    assert lines[4] == "| dynamic | dynamic_sampling=true | - | not run | | | | | | | |"
