"""Shared pieces of the tiny-model compile tests: a task, a reward with spread, and a small config."""

import dspy

SIG = dspy.Signature("question -> answer", "Answer the question.")
TRAIN = [dspy.Example(question=f"What is {a} plus {b}?", answer=str(a + b)).with_inputs("question")
         for a in range(4) for b in range(3)]


def length_metric(example, prediction, trace=None):
    """A real, deterministic reward with spread across samples: prefers answers of some lengths."""
    return (len(str(prediction.answer)) % 4) / 3.0


def tiny_config(**kw):
    """A compile budget of seconds on the tiny model; keyword arguments override."""
    cfg = dict(steps=2, examples_per_step=2, group_size=3, max_tokens=6, eval_every=1, learning_rate=5e-3,
               keep="last", lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    cfg.update(kw)
    return cfg
