"""What weight training does with the student's own demos (compilers.student_demos): the rules' registry, the demos as
the calls they demonstrate (complete ones only, trained roles only, the zero-shot prompt), the rows on each role's
adapter, the config's check; and on the tiny real model a compile that keeps, drops or internalizes a prompt
optimizer's demos (the adapters move before step 1 only when internalizing; the artifact holds no dropped demo)."""

import json
import typing

import dspy
import pytest

from compilers import MMGRPO
from compilers.config import MMGRPOConfig, PromptsConfig
from compilers.student_demos import RULES, DemoCalls, demo_calls, demo_counts, demo_rows, drop_demos
from programs import Voting
from tiny_setup import SIG, TRAIN, length_metric, tiny_config
from wfc.adapter import CompactChatAdapter
from wfc.engines.hf import HFEngine
from wfc.models import load_model

PARSER = CompactChatAdapter()


def cot_program():
    class TwoRoles(dspy.Module):
        def __init__(self):
            super().__init__()
            self.solve = dspy.ChainOfThought("question -> answer")
            self.check = dspy.Predict("question, answer -> verdict")

    program = TwoRoles()
    program.solve.predict.demos = [
        dspy.Example(question="1 + 1?", reasoning="1 + 1 = 2", answer="2"),  # bootstrapped: every field
        dspy.Example(question="2 + 2?", answer="4"),  # labeled: no reasoning
    ]
    program.check.demos = [dspy.Example(question="1 + 1?", answer="2", verdict="right")]
    return program


def test_the_rules_are_the_configs_choices():
    choices = typing.get_args(PromptsConfig.model_fields["student_demos"].annotation)
    assert set(choices) == set(RULES) and PromptsConfig().student_demos == "keep"
    assert [(r.drop, r.train) for r in RULES.values()] == [(False, False), (True, False), (True, True)]


def test_demo_calls_are_complete_demos_of_trained_roles_formatted_zero_shot():
    program = cot_program()
    calls = demo_calls(program, ["solve.predict"], PARSER)  # check is frozen here
    assert list(calls.chats) == ["solve.predict"] and calls.incomplete == {"solve.predict": 1}
    [chat] = calls.chats["solve.predict"]
    sig = program.solve.predict.signature
    assert chat["messages"][:-1] == PARSER.format(sig, [], {"question": "1 + 1?"})  # no demo in the prompt
    assert chat["messages"][-1]["role"] == "assistant"
    assert PARSER.parse(sig, chat["messages"][-1]["content"]) == {"reasoning": "1 + 1 = 2", "answer": "2"}


def test_drop_demos_clears_every_role_and_counts_them():
    program = cot_program()
    assert demo_counts(program) == {"solve.predict": 2, "check": 1}
    assert drop_demos(program) == {"solve.predict": 2, "check": 1}
    assert demo_counts(program) == {} and all(p.demos == [] for _, p in program.named_predictors())


def test_demo_rows_sit_on_each_roles_adapter_under_its_role(tiny_handle):
    engine = HFEngine(load_model("tiny"), batch_wait_s=0.02)
    try:
        program = cot_program()
        calls = demo_calls(program, ["solve.predict", "check"], PARSER)
        rows = demo_rows(engine, calls, {"solve.predict": "solver", "check": "checker"})
        assert [(r.role, r.adapter) for r in rows] == [("solve.predict", "solver"), ("check", "checker")]
        eos = engine.tokenizer.eos_token_id
        assert all(r.advantage == 1.0 and r.completion_ids[-1] == eos and r.engine_logprobs is None for r in rows)
        assert rows[0].prompt_ids == tuple(engine.encode_prompt(calls.chats["solve.predict"][0]["messages"][:-1]))
    finally:
        engine.close()
    assert demo_rows(None, DemoCalls(), {}) == []


def test_internalize_needs_a_strategy_that_trains_weights():
    with pytest.raises(ValueError, match="student_demos='internalize' fine-tunes"):
        MMGRPOConfig(strategy="p", student_demos="internalize")
    MMGRPOConfig(strategy="p", student_demos="drop")  # dropping is fine without weights
    with pytest.raises(ValueError):
        MMGRPOConfig(student_demos="forget")


# ----- the tiny real model --------------------------------------------------------------------------------------------
def student():
    """A Voting program holding a prompt optimizer's demos: two per voter, one for the aggregator."""
    program = Voting(SIG, n=2)
    program.voter.demos = [dspy.Example(question=e.question, answer=e.answer) for e in TRAIN[:2]]
    program.aggregator.demos = [dspy.Example(question=TRAIN[2].question, candidates=["2", "2"], answer="2")]
    return program


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def lora_b(state):
    return [v for k, v in state.items() if "lora_B" in k]


@pytest.mark.parametrize("rule", ["keep", "drop", "internalize"])
def test_a_compile_keeps_drops_or_internalizes_the_students_demos(engine, tmp_path, rule):
    program = student()
    run_dir = tmp_path / rule
    compiled = MMGRPO(length_metric, **tiny_config(steps=0, student_demos=rule, warm_start_batch=2)).compile(
        program, trainset=TRAIN, valset=TRAIN[:2], engine=engine, backend="isolated", run_dir=run_dir,
        progress=False)
    assert demo_counts(program) == {"voter": 2, "aggregator": 1}  # the student itself is never mutated
    saved = demo_counts(compiled.program)
    log = records(run_dir)
    kinds = [r["kind"] for r in log]
    if rule == "keep":
        assert saved == {"voter": 2, "aggregator": 1} and "student_demos" not in kinds
        return
    assert saved == {}  # the artifact's program holds no dropped demo
    [rec] = [r for r in log if r["kind"] == "student_demos"]
    assert rec["rule"] == rule and rec["demos"] == {"voter": 2, "aggregator": 1}
    assert kinds.index("student_demos") < kinds.index("eval")  # step 0 validates the program GRPO starts from
    assert [r["kind"] for r in compiled.manifest.history][0] == "student_demos"
    moved = {a: all(v.abs().sum() > 0 for v in lora_b(s)) for a, s in compiled.revisions[0].items()}
    if rule == "drop":
        assert rec["trained"] == {} and rec["optimizer_steps"] == 0 and not any(moved.values())
        return
    # internalize: every demo names every field of its role's signature, so both roles train on all of theirs
    assert rec["trained"] == {"voter": 2, "aggregator": 1} and rec["incomplete"] == {}
    assert rec["optimizer_steps"] == 2  # 3 rows in batches of 2, one epoch
    assert rec["loss_after"]["all"] < rec["loss_before"]["all"]
    assert set(rec["loss_before"]) == {"all", "voter", "aggregator"}
    assert moved == {compiled.roles["voter"]: True, compiled.roles["aggregator"]: True}


def test_a_resumed_compile_drops_the_demos_again_and_trains_on_them_once(engine, tmp_path):
    config = tiny_config(student_demos="internalize", eval_every=0)
    run_dir = tmp_path / "run"
    MMGRPO(length_metric, **{**config, "steps": 0}).compile(student(), trainset=TRAIN, engine=engine,
                                                            run_dir=run_dir, progress=False)
    again = HFEngine(load_model("tiny"), batch_wait_s=0.02)
    try:
        resumed = MMGRPO(length_metric, **{**config, "steps": 1}).compile(
            student(), trainset=TRAIN, engine=again, run_dir=run_dir, progress=False, resume=run_dir)
    finally:
        again.close()
    assert demo_counts(resumed.program) == {}
    log = records(run_dir)
    assert [r["kind"] for r in log].count("student_demos") == 1 and any(r["kind"] == "resume" for r in log)
    assert [r["kind"] for r in resumed.manifest.history].count("student_demos") == 1
