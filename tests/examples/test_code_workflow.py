"""examples/code_workflow.py: whole runs (baseline -> compile -> held-out -> save) on the tiny model with the script's
own flags, and benchmarks/compose_check.py on the artifacts they save. What each role did is tested on hand-built
rollouts beside the library (tests/compilers/test_role_report.py)."""

from __future__ import annotations

import json

import pytest
import torch

import wfc
from benchmarks import compose_check
from wfc.adapter import CompactChatAdapter
from wfc.compose import carry_role


@pytest.fixture()
def script(load_example):
    return load_example('code_workflow')


def test_the_retry_workflow_answers_again_while_the_shown_example_fails(script, tiny_handle, tmp_path, monkeypatch):
    """--program retry: programs.Retry(check=example_check) compiled with the writer's demos; the artifact rebuilds
    it with its check, attempts and retry temperature."""
    monkeypatch.chdir(tmp_path)
    summary = script.main(["--model", "tiny", "--program", "retry", "--attempts", "2", "--retrieved-demos", "1",
                           "--steps", "1", "--n-train", "4", "--n-val", "2", "--n-test", "3", "--examples-per-step",
                           "1", "--group-size", "2", "--max-tokens", "8", "--eval-every", "0", "--set",
                           "dynamic_sampling=false"])
    assert summary["program"] == "retry" and summary["attempts"] == 2 and summary["sample_retries"] == 0.8
    # the tiny model's code never passes the shown example, so every held-out task used both retries
    assert summary["revised_after"] == 3 and summary["revision_calls_after"] == 6 and summary["fixed_after"] == 0
    art = tmp_path / "artifacts" / "code-retry-2x0.8-rag1"
    assert json.loads((art / "manifest.json").read_text())["roles"].keys() == {"solver"}
    loaded = wfc.load(art, model="tiny")
    try:
        program = loaded.program
        assert (program.check.__name__, program.attempts, program.sample_retries) == ("example_check", 2, 0.8)
    finally:
        loaded.engine.close()
    with pytest.raises(SystemExit):  # Retry has no fixer role to freeze
        script.main(["--program", "retry", "--frozen-fixer"])
    with pytest.raises(SystemExit):
        script.main(["--program", "retry", "--attempts", "-1"])
    for bad in (["--program", "retry", "--vary-demos"],  # no retrieved demos to vary
                ["--program", "single", "--vary-demos", "--retrieved-demos", "1"],  # no retries
                ["--program", "retry", "--sample-retries", "0", "--retrieved-demos", "1"]):  # greedy repeats
        with pytest.raises(SystemExit):
            script.main(bad)


def test_retry_without_training_retries_trains_the_writer_as_single_does(script, tiny_handle, tmp_path, monkeypatch):
    """--program retry --no-train-retries: training rollouts answer once, so the compile spends its tokens as
    --program single does and ends with the same adapter, bit for bit; evaluation still retries (greedy, each retry
    shown the nearest training task with another solution)."""
    from safetensors.torch import load_file

    monkeypatch.chdir(tmp_path)
    common = ["--model", "tiny", "--retrieved-demos", "1", "--steps", "2", "--n-train", "6", "--n-val", "2",
              "--n-test", "3", "--examples-per-step", "2", "--group-size", "2", "--max-tokens", "8", "--eval-every",
              "0", "--set", "dynamic_sampling=false"]
    single = script.main(["--program", "single", *common])
    retry = script.main(["--program", "retry", "--attempts", "2", "--no-train-retries", "--vary-demos",
                         "--sample-retries", "0", *common])
    assert retry["train_retries"] is False and retry["rollout_tokens"] == single["rollout_tokens"]
    arts = [tmp_path / "artifacts" / name for name in ("code-single-rag1", "code-retry-2x0-vary-first-rag1")]
    tensors = [load_file(next(a.glob("adapters/*/adapter_model.safetensors"))) for a in arts]
    assert tensors[0].keys() == tensors[1].keys()
    assert all(torch.equal(tensors[0][k], tensors[1][k]) for k in tensors[0])
    assert retry["writer_after"] == single["after"]  # the same first answers
    assert retry["revision_calls_after"] == 6  # the tiny model's code never passes its example: 2 retries each
    loaded = wfc.load(arts[1], model="tiny")
    try:  # the artifact rebuilds the options
        program = loaded.program
        assert (program.vary_demos, program.train_retries, program.sample_retries) == (True, False, None)
    finally:
        loaded.engine.close()
    with pytest.raises(SystemExit):
        script.main(["--program", "single", "--no-train-retries"])


def test_the_checked_workflow_runs_the_prompts_example_instead_of_a_reviewer(script, tiny_handle, tmp_path,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    summary = script.main(["--model", "tiny", "--check", "--backend", "isolated", "--steps", "1", "--n-train", "4",
                           "--n-val", "2", "--n-test", "3", "--examples-per-step", "1", "--group-size", "2",
                           "--max-tokens", "8", "--eval-every", "0"])
    assert summary["check"] is True and summary["reviewer_accept_before"] is None
    tasks = [json.loads(line) for line in (tmp_path / "runs" / "code-evalopt-check" / "tasks.jsonl").read_text()
             .splitlines()]  # per held-out task, for pairing runs
    assert [t["task"] for t in tasks] == [0, 1, 2]
    assert all(t["function"] for t in tasks) and summary["functions"] == len({t["function"] for t in tasks})
    assert sum(t["after"] for t in tasks) / 3 == pytest.approx(summary["after"])
    # the tiny model's code never passes the shown example, so every held-out task went to the fixer
    assert summary["revised_before"] == summary["revised_after"] == 3
    assert (tmp_path / "runs" / "code-evalopt-check" / "summary.json").exists() and summary["rollout_tokens"] > 0
    manifest = json.loads((tmp_path / "artifacts" / "code-evalopt-check" / "manifest.json").read_text())
    assert set(manifest["roles"]) == {"generator", "optimizer"} and manifest["backend"] == "isolated"
    assert len(set(manifest["roles"].values())) == 2  # an adapter of its own for each role
    loaded = wfc.load(tmp_path / "artifacts" / "code-evalopt-check", model="tiny")
    try:
        assert loaded.program.check.__name__ == "example_check"
    finally:
        loaded.engine.close()
    with pytest.raises(SystemExit):  # a check has no verdict to choose
        script.main(["--check", "--choose-verdict"])


def test_the_single_role_rival_trains_the_writer_alone_within_a_token_budget(script, tiny_handle, tmp_path,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    summary = script.main(["--model", "tiny", "--program", "single", "--steps", "20", "--n-train", "4", "--n-val",
                           "2", "--n-test", "3", "--examples-per-step", "1", "--group-size", "2", "--max-tokens", "8",
                           "--eval-every", "0", "--set", "max_rollout_tokens=20", "--run-dir", str(tmp_path / "run"),
                           "--out", str(tmp_path / "artifact")])
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [e for e in steps if e["kind"] == "step"]
    assert summary["program"] == "single" and "writer_before" not in summary
    # the budget stopped it after the first step that spent it (one step draws at least 2 x 8 tokens, so 20 take
    # at most two), and only the writer ("solver") was drawn
    assert len(steps) <= 2 and summary["rollout_tokens"] >= 20
    assert steps[-1]["drawing"]["completion_tokens_total"] == summary["rollout_tokens"]
    assert all(set(e["roles"]) <= {"solver"} for e in steps)
    for flag in ("--choose-verdict", "--check"):  # Single has no reviewer to replace
        with pytest.raises(SystemExit):
            script.main(["--program", "single", flag])


def test_the_code_workflow_runs_end_to_end_on_the_tiny_model(script, tiny_handle, tmp_path, monkeypatch):
    # tiny_handle builds the tiny model's files once per session; the script then loads it by name
    monkeypatch.chdir(tmp_path)
    summary = script.main(["--model", "tiny", "--steps", "1", "--n-train", "4", "--n-val", "2", "--n-test", "3",
                           "--examples-per-step", "1", "--group-size", "2", "--max-tokens", "8", "--eval-every", "0",
                           "--set", "credit=verified-strict", "--choose-verdict",
                           "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "artifact")])
    assert json.loads(json.dumps(summary, default=str)) == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["recipe"] == "wide-warmup" and summary["steps"] == 1 and summary["max_tokens"] == 8
    assert summary["n_test"] == 3 and summary["only_after"] + summary["only_before"] <= 3
    assert summary["difference"] == pytest.approx(summary["after"] - summary["before"])
    for key in ("before", "after", "writer_before", "writer_after", "reviewer_accept_before", "reviewer_accept_after"):
        assert 0.0 <= summary[key] <= 1.0
    assert summary["rollout_tokens"] > 0  # read from the run's own metrics.jsonl
    manifest = json.loads((tmp_path / "artifact" / "manifest.json").read_text())
    assert manifest["base_model"] == "tiny"
    assert summary["credit"] == "verified-strict" and summary["overrides"] == {"credit": "verified-strict"}
    assert summary["choose_verdict"] is True
    loaded = wfc.load(tmp_path / "artifact", model="tiny")
    try:  # the shipped reviewer still chooses its verdict
        judge = dict(loaded.program.named_predictors())["evaluator"]
        assert CompactChatAdapter.choices(judge.signature) == ("correct", "incorrect")
    finally:
        loaded.engine.close()
    assert not (tmp_path / "runs").exists() and not (tmp_path / "artifacts").exists()  # only where it was told


def test_a_killed_code_run_resumes_from_its_checkpoint(script, tiny_handle, tmp_path, monkeypatch):
    """--resume continues the run in --run-dir after its last checkpointed step (a 70-minute run killed at step 5
    need not start over); the summary is the finished run's."""
    monkeypatch.chdir(tmp_path)
    flags = ["--model", "tiny", "--n-train", "4", "--n-val", "2", "--n-test", "2", "--examples-per-step", "1",
             "--group-size", "2", "--max-tokens", "8", "--eval-every", "0", "--run-dir", str(tmp_path / "run"),
             "--out", str(tmp_path / "artifact")]
    script.main(flags + ["--steps", "1"])
    summary = script.main(flags + ["--steps", "2", "--resume"])
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [e["after_step"] for e in events if e["kind"] == "resume"] == [1]
    assert [e["step"] for e in events if e["kind"] == "step"] == [1, 2]
    assert summary["steps"] == 2 and (tmp_path / "artifact" / "manifest.json").exists()


def test_a_trained_writer_composes_with_the_example_check_and_a_base_fixer(script, tiny_handle, tmp_path,
                                                                           monkeypatch):
    """benchmarks/compose_check.py on a tiny single-role artifact: the writer alone scores as the run's own held-out
    evaluation did; inside EvalOpt(check=example_check) every task (the tiny model's code never passes its example)
    goes to the fixer, which runs on the base model."""
    monkeypatch.chdir(tmp_path)
    summary = script.main(["--model", "tiny", "--program", "single", "--steps", "1", "--n-train", "4", "--n-val",
                           "2", "--n-test", "3", "--examples-per-step", "1", "--group-size", "2", "--max-tokens", "8",
                           "--eval-every", "0", "--out", str(tmp_path / "art")])
    result = compose_check.main([str(tmp_path / "art"), "--n-test", "3", "--out", str(tmp_path / "c.json")])
    assert result["writer_adapter"] == "shared" and result["writer"]["pass@1"] == summary["after"]
    assert result["fixer_calls"] == 3 and len(result["tasks"]["checked"]) == 3
    assert result["ran_on"] == {"generator": ["shared"], "optimizer": ["None"]}
    assert result["checked_minus_writer"]["difference"] == pytest.approx(
        result["checked"]["pass@1"] - result["writer"]["pass@1"])
    assert json.loads((tmp_path / "c.json").read_text())["tasks"] == result["tasks"]
    with pytest.raises(SystemExit, match="no role 'critic'"):
        compose_check.main([str(tmp_path / "art"), "--role", "critic", "--n-test", "3"])


def test_a_trained_writer_composes_into_retry_with_its_retrieved_demos(script, tiny_handle, tmp_path, monkeypatch):
    """compose_check.py --retry N on a tiny artifact trained with retrieved demos: the composed programs' writer
    carries the artifact's retriever (so it is prompted as trained), and every task (the tiny model's code never
    passes its example) gets N more answers from the writer's own adapter."""
    from programs import Retry
    from wfc.retrieve import retrievers
    from wfc.tasks import get_task
    from wfc.tasks.visible import example_check

    monkeypatch.chdir(tmp_path)
    summary = script.main(["--model", "tiny", "--program", "single", "--retrieved-demos", "1", "--steps", "1",
                           "--n-train", "6", "--n-val", "2", "--n-test", "3", "--examples-per-step", "1",
                           "--group-size", "2", "--max-tokens", "8", "--eval-every", "0", "--set",
                           "dynamic_sampling=false", "--out", str(tmp_path / "art")])
    result = compose_check.main([str(tmp_path / "art"), "--n-test", "3", "--retry", "2"])
    assert result["retry"] == 2 and result["fixer_calls"] == 6 and result["ran_on"] == {"solver": ["shared"]}
    assert result["writer"]["pass@1"] == summary["after"]
    loaded = wfc.load(tmp_path / "art", model="tiny")
    try:
        program = Retry(get_task("codegen", n_train=6, n_val=2, n_test=3).signature, check=example_check)
        assert carry_role(loaded, "solver", program, "solver") == "shared"
        assert retrievers(program) == retrievers(loaded.program) and retrievers(program)
    finally:
        loaded.engine.close()
    with pytest.raises(SystemExit):
        compose_check.main([str(tmp_path / "art"), "--retry", "-1"])
    # greedy retries shown the nearest training tasks with other solutions: same calls, each retry a prompt of its own
    varied = compose_check.main([str(tmp_path / "art"), "--n-test", "3", "--retry", "2", "--vary-demos",
                                 "--sample-retries", "0"])
    assert (varied["vary_demos"], varied["sample_retries"], varied["fixer_calls"]) == (True, None, 6)
    assert varied["writer"] == result["writer"]
    for bad in (["--vary-demos"], ["--retry", "2", "--sample-retries", "0"]):
        with pytest.raises(SystemExit):
            compose_check.main([str(tmp_path / "art"), *bad])


def test_the_checked_workflow_with_a_frozen_fixer_trains_the_writer_alone_on_its_budget(script, tiny_handle,
                                                                                        tmp_path, monkeypatch):
    """--check --frozen-fixer: the fixer has no adapter, training rollouts never call it (the tiny model's code
    always fails the example, so every rollout would), and the held-out runs still do; --fresh-fix travels in the
    artifact (the loaded fixer is not shown the code it replaces)."""
    monkeypatch.chdir(tmp_path)
    summary = script.main(["--model", "tiny", "--check", "--frozen-fixer", "--fresh-fix", "--steps", "1",
                           "--n-train", "4", "--n-val", "2", "--n-test", "3", "--examples-per-step", "1",
                           "--group-size", "2", "--max-tokens", "8", "--eval-every", "0", "--set",
                           "dynamic_sampling=false"])
    run = tmp_path / "runs" / "code-evalopt-check-frozen-fresh"
    assert summary["fresh_fix"] is True and summary["frozen_fixer"] is True
    assert summary["frozen_roles"] == ["optimizer"] and summary["skip_frozen"]
    (step,) = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"]
    assert set(step["roles"]) == {"generator"} and step["drawing"]["completion_tokens"] == step["roles"][
        "generator"]["tokens"]
    assert summary["revised_after"] == 3  # held out: the whole program, fixer included
    art = tmp_path / "artifacts" / "code-evalopt-check-frozen-fresh"
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["roles"] == {"generator": "shared", "optimizer": None}
    loaded = wfc.load(art, model="tiny")
    try:
        assert loaded.program.show_previous is False
        assert list(loaded.program.optimizer.signature.input_fields) == ["prompt", "feedback"]
    finally:
        loaded.engine.close()
    with pytest.raises(SystemExit):
        script.main(["--program", "single", "--frozen-fixer"])


def test_retrieved_demos_show_the_writer_gold_solutions_and_unseen_tasks_are_scored_apart(script, tiny_handle,
                                                                                           tmp_path, monkeypatch):
    """--retrieved-demos K: compile gets retrieved_demos=K with the gold solutions as the writer's demo labels, the
    artifact keeps the pool, and the held-out tasks whose solution no training task has are scored apart."""
    from wfc.tasks import get_task

    monkeypatch.chdir(tmp_path)
    summary = script.main(["--model", "tiny", "--program", "single", "--retrieved-demos", "1", "--steps", "1",
                           "--n-train", "6", "--n-val", "2", "--n-test", "4", "--examples-per-step", "1",
                           "--group-size", "2", "--max-tokens", "8", "--eval-every", "0", "--set",
                           "dynamic_sampling=false", "--out", str(tmp_path / "art")])
    assert summary["retrieved_demos"] == 1 and summary["demo_labels"] == {"code": "solution"}
    task = get_task("codegen", n_train=6, n_val=2, n_test=4)
    seen = [ex.solution in {t.solution for t in task.trainset} for ex in task.testset]
    tasks = [json.loads(line) for line in (tmp_path / "runs" / "code-single-rag1" / "tasks.jsonl").read_text()
             .splitlines()]
    assert [t["seen_solution"] for t in tasks] == seen
    assert summary["unseen"]["n"] == seen.count(False)
    if seen.count(False):
        assert summary["unseen"]["after"] == pytest.approx(
            sum(t["after"] for t in tasks if not t["seen_solution"]) / seen.count(False))
    pool = json.loads((tmp_path / "art" / "program" / "retrieval.json").read_text())
    assert [d["code"] for d in pool["solver"]["pool"]] == [ex.solution for ex in task.trainset]
    with pytest.raises(SystemExit):
        script.main(["--retrieved-demos", "-1"])
