"""Named compile recipes: MMGRPOConfig overrides that were measured to work, one registry (used by ``make demo``,
``benchmarks/learning.py`` and ``wfc compile --recipe``). A recipe is a plain dict, so a user can start from one and
override any field: ``MMGRPO(metric, **{**RECIPES["better-together"], "steps": 20})``.

- ``weights-only``: mmGRPO with verified per-role credit and keep-best validation.
- ``dynamic``: the same plus DAPO dynamic sampling (flat examples replaced, two draw rounds at most) over examples
  whose running pass rate is strictly between 0 and 1 (the demo's previous recipe, 14 steps). Measured on the demo
  (2-core CPU): about half the drawn examples were flat at first, so a step rolled out about twice as many examples
  for the same four trained ones; over three seeds it gained more evenly than ``weights-only`` (docs/results.md, "The demo's
  figures, per seed").
- ``fast``: ``dynamic`` at twice the learning rate (6e-4); what ``make demo`` ran (10 steps) before ``wide``.
  Measured on the demo, seed 1: validation 0.58 at step 5 against 0.30 for ``dynamic`` (0.43 at 1e-3, which learned
  less), so ten steps gain more than fourteen did.
- ``concise``: ``fast`` with ``overlong_penalty=0.2`` (a call cut at ``max_tokens`` scores 0.2 less) and validation
  every 2 steps. Why: on seed 2 ``fast``'s voters drifted into "Sam has 14 + 16 = 30", 13+ tokens, so 12-token
  answers were cut to "... = 3" and validation fell back (the step log's ``truncated_rate``). A penalty of 0.5 swung
  the voters between cut and bare (wrong) answers; 0.2 kept the rise steady. Validating every 2 steps lets keep-best
  catch a peak between swings.
- ``finish``: ``fast`` with room for the answer, for programs whose roles stop at a newline
  (``dspy.Predict(sig, stop=("\\n",))``): 20 new tokens per call and ``overlong_penalty=0.2``. Why: at 12 tokens the
  demo's voters were cut on ~99% of calls ("Sam has 14 + 16 = 3"), so an answer counted only when its number landed
  inside the budget, and the penalty had nothing to contrast (every sample cut). With the newline stop and a larger
  budget about half the base model's answers finish, the penalty rewards those, and the voters learn to end their
  sum (cut on a few % of calls by step 10). Validation every 5 steps keeps the demo inside its time. Measured on
  the demo (five runs): +0.150 to +0.423, mean +0.282, no more than ``fast`` and slower, so the demo stays on ``fast``.
- ``fast-cosine``: ``fast`` with a cosine-decaying rate (``compilers.schedule``): 8e-4 at step 1 down to 2e-4 at the
  last step (about the same summed rate over ten steps as ``fast``, more of it early). Why: on ``fast`` the demo's
  validation peaked by step 3-5 on some seeds and then wandered (seed 2: 0.43 at step 3, 0.35-0.39 after).
- ``wide``: ``fast`` with twice the problems per step at the same rollouts: 8 kept problems x 4 rollouts instead of
  4 x 8 (what ``make demo`` ran before ``wide-warmup``). Why: in Voting a problem's 8 rollouts gave each voter
  invocation a group of 8 samples of one prompt (24 voter samples a problem), and the model's errors repeat across
  samples, so half of them taught little; the step's gradient then rested on 4 problems. With 4 rollouts a problem
  the groups are smaller but the step averages over 8 problems (dynamic sampling still drops the flat ones).
  Measured on the demo (seeded, alone): +0.400 / +0.507 / +0.170 on seeds 0 / 1 / 2 in 10.1-11.7 min, against +0.09
  to +0.35 for ``fast``; the weak draw's voters lose their entropy by step 6 (docs/results.md, "The demo's figures, per seed").
- ``wide-warmup``: ``wide`` with the learning rate ramped over the first two steps (3e-4, then 6e-4); what ``make
  demo`` runs (14 steps since stop 32: +0.510 / +0.557 / +0.460 on seeds 0 / 1 / 2, each within 5 points of the
  mean; 9m41s from a fresh clone on stop 32's machine). Why: AdamW's first steps move every LoRA weight by about the
  full rate whatever its gradient (the first step is the rate times the gradient's sign, before the second moments
  average anything), so the first
  updates, taken on 8 problems' noisy gradients, steer hardest; on the demo's weak draw (``wide``, seed 2) the voters'
  answer form was set by step 5. Measured on the demo (seeded; seeds 0 / 1 / 2 / 3): +0.507 / +0.410 / +0.373 /
  +0.540, mean +0.458, against ``wide``'s +0.400 / +0.507 / +0.170: the first recipe whose every seed gains 35 points
  (docs/results.md, "The demo's figures, per seed"). All four were still climbing at step 10; run to 14 steps (the demo's
  ``WFC_DEMO_STEPS=14``) they gain +0.507 / +0.530 / +0.460 / +0.540, within 5 points of their mean (+0.509; a second
  seed-0 draw, from a fresh clone: +0.563), where 10 steps spread 17 points; a higher rate in 10 steps instead (9e-4
  after a 3-step ramp) made the weak draw worse (+0.223).
- ``better-together``: bootstrap two demonstrations per role from the program's own passing runs (prompt
  optimization), then ``weights-only``.
- ``prompts-only``: the demos without any training (prompt optimization alone).
"""

from __future__ import annotations

from typing import Any

_GRPO: dict[str, Any] = dict(
    examples_per_step=4, group_size=8, max_tokens=12, temperature=0.7, learning_rate=3e-4, advantage="dr_grpo",
    loss_aggregation="token", credit="verified", eval_every=5)
_DYNAMIC: dict[str, Any] = dict(dynamic_sampling=True, max_draw_rounds=2, pass_band=(0.0, 1.0))
_DEMOS: dict[str, Any] = dict(demos_per_role=2, bootstrap_examples=24, bootstrap_repeats=2)
_WIDE: dict[str, Any] = {**_GRPO, **_DYNAMIC, "strategy": "w", "learning_rate": 6e-4, "examples_per_step": 8,
                         "group_size": 4}

RECIPES: dict[str, dict[str, Any]] = {
    "better-together": {**_GRPO, **_DEMOS, "strategy": "p -> w"},
    "weights-only": {**_GRPO, "strategy": "w"},
    "dynamic": {**_GRPO, **_DYNAMIC, "strategy": "w"},
    "fast": {**_GRPO, **_DYNAMIC, "strategy": "w", "learning_rate": 6e-4},
    "prompts-only": {**_GRPO, **_DEMOS, "strategy": "p"},
    "concise": {**_GRPO, **_DYNAMIC, "strategy": "w", "learning_rate": 6e-4, "overlong_penalty": 0.2,
                "eval_every": 2},
    "finish": {**_GRPO, **_DYNAMIC, "strategy": "w", "learning_rate": 6e-4, "max_tokens": 20,
               "overlong_penalty": 0.2},
    "wide": _WIDE,
    "wide-warmup": {**_WIDE, "warmup_steps": 2},
    "fast-cosine": {**_GRPO, **_DYNAMIC, "strategy": "w", "learning_rate": 8e-4, "lr_schedule": "cosine",
                    "min_lr_ratio": 0.25},
}


def get_recipe(name: str) -> dict[str, Any]:
    if name not in RECIPES:
        raise ValueError(f"recipe {name!r} is unknown: use one of {sorted(RECIPES)}")
    return dict(RECIPES[name])
