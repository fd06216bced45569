"""Cohorts (wfc.engines.cohort): an engine forms the same batches however a cohort's threads are timed.

A recording engine checks the batches exactly (one request per running member a round, the same rounds under any
jitter, a lent slot never opening a gap); the tiny real model checks that seeded rollouts under jitter give the same
batches and bit-equal log-probs."""

from __future__ import annotations

import contextvars
import random
import threading
import time

import dspy
import pytest

from wfc.engines.base import Generation, GenerationRequest, SamplingParams
from wfc.engines.batching import BatchingEngine
from wfc.engines.cohort import Cohort, cohort_map, current, request_order
from wfc.lower import parallel_map, run_rollouts

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


class RecordingEngine(BatchingEngine):
    """Answers each request with its last message's text; records every batch's request texts, in row order."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.batches: list[list[str]] = []

    def _generate_batch(self, requests, sampling):
        self.batches.append([r.messages[-1]["content"] for r in requests])
        return [Generation(text=r.messages[-1]["content"], prompt_ids=[], completion_ids=[], logprobs=[])
                for r in requests]


def ask(engine, text: str) -> str:
    return engine.submit(GenerationRequest(messages=({"role": "user", "content": text},), sampling=GREEDY)).result()


def jittery_member(engine, rng_seed: int, calls: int):
    """A member that makes ``calls`` sequential calls with a random pause before each (the pause is what a loaded
    machine does to a thread); member m's call c is the text "m.c"."""

    def run(m: int) -> list[str]:
        rng = random.Random(rng_seed * 1000 + m)
        out = []
        for c in range(calls if m % 2 else calls - 1):  # odd members make one call more: rounds shrink at the end
            time.sleep(rng.uniform(0, 0.03))
            out.append(ask(engine, f"{m}.{c}").text)
        return out

    return run


@pytest.mark.parametrize("workers", [6, 4])  # 4 < 6 items: a worker takes a second item as soon as its first ends
def test_batches_do_not_follow_thread_timing(workers):
    seen = []
    for jitter in (1, 2, 3):
        engine = RecordingEngine(batch_wait_s=0.0)  # without a cohort a 0 s quiet period batches by arrival alone
        try:
            items = list(range(6))
            out = cohort_map(jittery_member(engine, jitter, 3), items, [contextvars.copy_context() for _ in items],
                             workers)
        finally:
            engine.close()
        assert out[1] == ["1.0", "1.1", "1.2"] and out[0] == ["0.0", "0.1"]
        seen.append(engine.batches)
    assert seen[0] == seen[1] == seen[2]
    if workers == 6:  # every running member's call in each round, in content order
        assert seen[0] == [[f"{m}.0" for m in range(6)], [f"{m}.1" for m in range(6)], ["1.2", "3.2", "5.2"]]
    assert engine.batching_stats == {"lockstep_batches": len(seen[2]), "lockstep_timeouts": 0}


def test_a_member_lends_its_slot_to_its_fan_out():
    """Each member calls once, fans out to 3 helpers that call once each (at random moments), then calls again:
    the helpers' calls are one round, and the member's second call never goes without the others'."""
    for jitter in (1, 2):
        engine = RecordingEngine(batch_wait_s=0.0)
        rng = random.Random(jitter)
        pauses = [rng.uniform(0, 0.03) for _ in range(64)]

        def member(m: int) -> None:
            time.sleep(pauses[m])
            ask(engine, f"{m}.first")
            parallel_map(lambda h: (time.sleep(pauses[8 + 3 * m + h]), ask(engine, f"{m}.help{h}")), range(3))
            time.sleep(pauses[40 + m])
            ask(engine, f"{m}.last")

        try:
            parallel_map(member, range(4))
        finally:
            engine.close()
        assert engine.batches == [sorted(f"{m}.first" for m in range(4)),
                                  sorted(f"{m}.help{h}" for m in range(4) for h in range(3)),
                                  sorted(f"{m}.last" for m in range(4))]


def test_member_blocked_elsewhere_times_out_and_is_counted():
    """A member waiting on something other than an engine holds its cohort's batch only ``lockstep_timeout_s``."""
    engine = RecordingEngine(batch_wait_s=0.0, lockstep_timeout_s=0.2)
    release = threading.Event()

    def member(m: int) -> str:
        if m == 0:
            release.wait(5)  # blocked elsewhere: the other member's call must not wait for this forever
            return "blocked"
        text = ask(engine, "1.0").text
        release.set()
        return text

    t0 = time.monotonic()
    try:
        assert parallel_map(member, range(2)) == ["blocked", "1.0"]
    finally:
        engine.close()
    assert 0.15 < time.monotonic() - t0 < 4
    assert engine.batching_stats["lockstep_timeouts"] == 1


def test_cohort_map_runs_every_item_and_raises_the_first_failure_in_item_order():
    ran = []

    def fn(i):
        ran.append(i)
        if i in (2, 4):
            raise ValueError(f"item {i}")
        return current()

    with pytest.raises(ValueError, match="item 2"):
        cohort_map(fn, list(range(6)), [contextvars.copy_context() for _ in range(6)], 3)
    assert sorted(ran) == list(range(6))
    cohorts = cohort_map(fn, [0, 1], [contextvars.copy_context() for _ in range(2)], 2)
    assert cohorts[0] is cohorts[1] and isinstance(cohorts[0], Cohort) and cohorts[0].active == 0
    assert current() is None  # the caller's own context is untouched


def test_requests_outside_a_cohort_still_batch_by_timing():
    engine = RecordingEngine(batch_wait_s=0.3)
    try:
        futures = [engine.submit(GenerationRequest(messages=({"role": "user", "content": t},), sampling=GREEDY))
                   for t in ("b", "a")]
        assert [f.result().text for f in futures] == ["b", "a"]
    finally:
        engine.close()
    assert engine.batches == [["b", "a"]]  # arrival order: no cohort, no reordering
    assert engine.batching_stats == {"lockstep_batches": 0, "lockstep_timeouts": 0}


def test_request_order_is_by_contents():
    a = GenerationRequest(messages=({"role": "user", "content": "x"},), seed=3)
    b = GenerationRequest(messages=({"role": "user", "content": "x"},), seed=1)
    assert sorted([a, b], key=request_order) == [b, a]


# ----- the tiny real model ------------------------------------------------------------------------------------------
class TwoStep(dspy.Module):
    """A draft then a check, with a random pause between (what a loaded machine does to a rollout's thread)."""

    def __init__(self, pauses: list[float]):
        super().__init__()
        self.draft = dspy.Predict("question -> answer")
        self.check = dspy.Predict("question, answer -> verdict")
        self.pauses = pauses

    def forward(self, question):
        answer = self.draft(question=question).answer
        time.sleep(self.pauses[int(question.split()[2]) % len(self.pauses)])
        return dspy.Prediction(answer=answer, verdict=self.check(question=question, answer=answer).verdict)


def test_seeded_rollouts_repeat_bit_for_bit_under_jitter(tiny_handle):
    from wfc.engines.hf import HFEngine

    examples = [dspy.Example(question=f"What is {i} + 2?").with_inputs("question") for i in range(6)]
    sampling = SamplingParams(temperature=1.0, max_tokens=6)
    runs = []
    for jitter in (1, 2):
        rng = random.Random(jitter)
        program = TwoStep([rng.uniform(0, 0.05) for _ in range(6)])
        engine = HFEngine(tiny_handle, batch_wait_s=0.0)  # its own engine: exact stats
        try:
            graphs = run_rollouts(program, examples, engine, repeats=2, sampling=sampling,
                                  seeds=list(range(6)), max_workers=5)
        finally:
            engine.close()
        runs.append(([[(c.role, c.completion_ids, c.logprobs) for c in g.calls] for gs in graphs for g in gs],
                     engine.stats["batch_sizes"]))
    assert runs[0][1] == runs[1][1]  # the same batches
    assert runs[0][0] == runs[1][0]  # and so the same tokens with bit-equal log-probs
