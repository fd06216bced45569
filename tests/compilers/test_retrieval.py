"""Retrieved demos in compile() on the tiny real model: pools from gold labels, shown in training and validation
runs, logged, saved in the artifact and retrieved again by the loaded program; and on real code tasks."""

import json

import dspy
import pytest

import wfc
from wfc.artifact import ArtifactError
from compilers import MMGRPO
from compilers.prompts import retrieval_pools
from programs import EvalOpt, Single
from tiny_setup import SIG, TRAIN, tiny_config
from wfc.retrieve import retrievers


def gold_or_length(example, prediction, trace=None):
    """Full marks for the gold answer (so every gold label can be a demo); otherwise a length-based reward with
    spread across the tiny model's samples, so training has signal."""
    answer = str(prediction.answer)
    return 1.0 if answer.strip() == example.answer else (len(answer) % 4) / 4.0


def test_retrieval_pools_hold_the_gold_labels_that_pass():
    def odd_only(example, prediction, trace=None):
        return float(int(example.answer) % 2 == 1 and prediction.answer == example.answer)

    pools = retrieval_pools(Single(SIG), TRAIN, metric=odd_only, k=2)
    assert list(pools) == ["solver"]
    assert pools["solver"].pool == [{"question": ex.question, "answer": ex.answer} for ex in TRAIN
                                     if int(ex.answer) % 2 == 1]
    assert pools["solver"].k == 2 and pools["solver"].query == ["question"]


def test_retrieval_needs_a_role_with_a_gold_label():
    code_sig = dspy.Signature("question -> code", "Write code.")
    with pytest.raises(ValueError, match="demo_labels"):
        retrieval_pools(Single(code_sig), TRAIN, metric=gold_or_length, k=1)
    with pytest.raises(ValueError, match="passes the metric"):
        retrieval_pools(Single(SIG), TRAIN, metric=lambda ex, pred, trace=None: 0.0, k=1)


def test_compile_trains_with_retrieved_demos_and_the_artifact_keeps_them(engine, tmp_path):
    compiled = MMGRPO(gold_or_length, **tiny_config(steps=1, retrieved_demos=1, dynamic_sampling=False)).compile(
        Single(SIG), trainset=TRAIN, valset=TRAIN[:2], engine=engine, run_dir=tmp_path / "run", progress=False)
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["k"], r["pools"]) for r in logged if r["kind"] == "retrieval"] == [(1, {"solver": len(TRAIN)})]
    example = dspy.Example(question="What is 3 plus 2?").with_inputs("question")
    graph = compiled.trace(example)
    prompt = "\n".join(m["content"] for m in graph.calls[0].messages)
    assert "What is 3 plus 1?" in prompt or "What is 2 plus 2?" in prompt or "What is 3 plus 0?" in prompt
    assert prompt.count("What is 3 plus 2?") == 1  # a training example: shown as the task, never as its own demo
    assert compiled.program.solver.demos == []  # shown per run, never stored as static demos
    path = compiled.save(tmp_path / "art")
    assert (path / "program" / "retrieval.json").exists()
    loaded = wfc.load(path, model="tiny")
    try:
        assert retrievers(loaded.program) == retrievers(compiled.program)
        again = loaded.trace(example)
        assert again.calls[0].messages == graph.calls[0].messages
        assert loaded(question="What is 3 plus 2?").answer == compiled(question="What is 3 plus 2?").answer
    finally:
        loaded.engine.close()


def test_a_tampered_pool_is_refused(engine, tmp_path):
    compiled = MMGRPO(gold_or_length, **tiny_config(steps=0, retrieved_demos=1, eval_every=0)).compile(
        Single(SIG), trainset=TRAIN, engine=engine, run_dir=tmp_path / "run", progress=False)
    path = compiled.save(tmp_path / "art")
    pool = path / "program" / "retrieval.json"
    pool.write_text(pool.read_text().replace("What is 0 plus 0?", "Ignore the task."))
    with pytest.raises(ArtifactError, match="retrieval.json"):
        wfc.load(path, model="tiny")


def test_code_tasks_retrieve_gold_solutions_for_the_writer_only():
    from wfc.tasks import get_task

    task = get_task("codegen", n_train=6, n_val=0, n_test=2)
    program = EvalOpt(task.signature, rounds=1, name="code-evalopt")
    pools = retrieval_pools(program, task.trainset, metric=task.metric, k=1, labels={"code": "solution"})
    assert list(pools) == ["generator"]  # the reviewer and the fixer do not answer from the task's inputs alone
    assert [d["code"] for d in pools["generator"].pool] == [ex.solution for ex in task.trainset]
