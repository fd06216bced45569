"""The mmGRPO compile configuration, in sections: one per stage of the compile, each stage given only its own.

A section is a frozen pydantic model holding the fields one stage reads (TRL and verl group their configs by stage
the same way; PEFT's ``LoraConfig`` is what one stage needs and nothing else). :class:`Sections` is the one table
of them, in the order the compile uses them:

- ``run``: how many steps, which seed, which optimizers (``strategy``);
- ``engine``: where the trained policy lives (device, dtype);
- ``plan``: which roles train, on adapters of what shape, how ``backend="auto"`` chooses;
- ``prompts``: demonstrations (bootstrapped, labeled, retrieved);
- ``warm_start``: fine-tuning on the program's own successes before GRPO;
- ``sampling``: which examples a step draws and how they are rolled out;
- ``credit``: rewards, per-call credit, groups and advantages;
- ``update``: the loss and the optimizer step;
- ``guards``: fan-out scaling, role balancing and clipping, per-role rates, the entropy floor, the cliff rollback;
- ``evaluation``: validation.

:class:`MMGRPOConfig` is every section at once, with flat field names (``MMGRPOConfig(group_size=4, lora={"r": 8})``,
the CLI's ``--set group_size=4 --set lora.r=8``, the recipes): its fields are the sections' fields, each defined once,
in one section. ``config.section(UpdateConfig)`` (or ``config.sections().update``) is what a stage is given.

A variant chosen by name (an advantage estimator, a credit rule, a grouping mode, a loss aggregation, an importance
correction, a strategy, a learning-rate schedule) is checked against its module's registry, the one list of its
names: a new variant is added there and nowhere else. The section hands the stage the registered object
(``UpdateConfig.aggregation``, ``CreditConfig.rule``, ...), which carries the variant's behaviour: no stage tests the
name. Validation names the bad field (pydantic's error says which); rules across fields raise with what to change.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal, Mapping, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from compilers.advantages import ADVANTAGES, Estimator
from compilers.credit import CREDIT, Credit
from compilers.group import GROUPING
from compilers.loss import AGGREGATIONS, Aggregation
from compilers.offpolicy import CORRECTIONS, ImportanceCorrection
from compilers.prompts import STRATEGIES, Strategy
from compilers.schedule import SCHEDULES


# field -> the registry its value names (each checked by its section's validator, looked up once by the stage)
REGISTRIES: dict[str, Mapping[str, object]] = {
    "credit": CREDIT, "grouping": GROUPING, "advantage": ADVANTAGES, "lr_schedule": SCHEDULES,
    "loss_aggregation": AGGREGATIONS, "importance_correction": CORRECTIONS, "strategy": STRATEGIES}


def registered(field: str, value: str, registry: Mapping[str, object]) -> str:
    """``value`` when ``registry`` (a variant's registry) holds it; else ``ValueError`` naming the registry's names."""
    if not isinstance(value, str) or value not in registry:
        raise ValueError(f"{field}={value!r} is unknown: use one of {sorted(registry)}")
    return value


class LoraSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1, le=256)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"

    def peft_config(self):
        from peft import LoraConfig

        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=self.target_modules, task_type="CAUSAL_LM")


class Section(BaseModel):
    """One stage's fields: frozen, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RunConfig(Section):
    """What the compile runs: its steps, its seed, and which optimizers (``compilers.loop``)."""

    steps: int = Field(20, ge=0, description="optimizer steps (each: sample, roll out, score, group, update)")
    strategy: str = Field(
        "w", description="w: weights only; p: few-shot demos only; 'p -> w': bootstrap demos per role, then weights "
                         "(compilers.prompts.STRATEGIES)")
    seed: int = 0

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, v: str) -> str:
        return registered("strategy", v, STRATEGIES)

    @property
    def optimizes(self) -> Strategy:
        """The strategy: whether the compile bootstraps demos, whether it trains weights."""
        return STRATEGIES[self.strategy]


class EngineConfig(Section):
    """Where the policy (the trained model) lives (``wfc.policy``); used when compile builds the policy itself."""

    device: str = Field("auto", description="auto (CUDA when available, else CPU) | cpu | cuda | cuda:N; training "
                                            "on CUDA runs under bf16 autocast")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="the policy's weight dtype")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward: less memory, slower")

    @field_validator("device")
    @classmethod
    def _device(cls, device: str) -> str:
        if not (device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
            raise ValueError(f"device={device!r} is not a device: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
        return device


class PlanConfig(Section):
    """The role -> adapter plan (``compilers.backends``, ``compilers.auto``): which roles train, the adapters' shape."""

    frozen_roles: list[str] = Field(
        default_factory=list, description="roles that run on the base model (no adapter) and are never trained: "
                                          "their calls stay in rollouts and validation, and make no training rows")
    lora: LoraSettings = LoraSettings()
    auto_trace_examples: int = Field(4, ge=1, description="trainset examples traced to choose the backend")
    auto_trace_repeats: int = Field(2, ge=1, description="rollouts per traced example")
    auto_dominance: float = Field(
        1.5, gt=1.0, description="a role is dominant when its completion-token share is >= this x 1/(number of roles)")

    @field_validator("frozen_roles")
    @classmethod
    def _frozen_roles(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"frozen_roles names a role twice: {v}")
        return v


class PromptsConfig(Section):
    """Prompt optimization composed with weight training (``compilers.prompts``; BetterTogether)."""

    demos_per_role: int = Field(2, ge=0, description="bootstrapped demonstrations per role (strategy p)")
    bootstrap_examples: int = Field(32, ge=1, description="trainset examples run to bootstrap demonstrations")
    bootstrap_repeats: int = Field(2, ge=1, description="sampled runs per bootstrap example (greedy first)")
    labeled_demos: bool = Field(
        False, description="roles that answer the task from its own inputs take gold-labeled demos (LabeledFewShot; "
                           "compilers.prompts) instead of bootstrapped ones")
    retrieved_demos: int = Field(
        0, ge=0, description="per run, each labeled role (one answering the task from its own inputs) is shown this "
                             "many gold-labeled training examples nearest to the task (TF-IDF; wfc.retrieve; "
                             "compilers.prompts.retrieval_pools), after any static demos; 0: off. The pools travel "
                             "in the artifact")
    student_demos: Literal["keep", "drop", "internalize"] = Field(
        "keep", description="the demos the student already holds (a prompt optimizer's, e.g. BetterTogether's p "
                            "step): keep them in the prompts; drop them (instructions kept); or internalize them "
                            "(fine-tune each trained role on its demos, then drop them; compilers.student_demos)")
    demo_labels: dict[str, str] = Field(
        default_factory=dict, description="role output field -> the training examples' field holding its gold value, "
                                          "for retrieved demos where the two are named differently, e.g. "
                                          "{'code': 'solution'}")


class WarmStartConfig(Section):
    """Before GRPO, fine-tune each role's adapter on the program's own successes (``compilers.warm_start``)."""

    warm_start_runs: int = Field(
        0, ge=0, description="before GRPO, run the program this many times (sampled, as in training) on every "
                             "training example, keep the trained roles' calls of the runs that scored full marks, and "
                             "fine-tune each role's adapter on them (rejection-sampling fine-tuning; costs "
                             "len(trainset) x this many runs, counted in max_rollout_tokens); 0: off")
    warm_start_epochs: int = Field(1, ge=1, description="passes of the warm start over its successes")
    warm_start_batch: int = Field(16, ge=1, description="successes per warm-start optimizer step")
    warm_start_lr: float | None = Field(
        None, gt=0.0, description="the warm start's learning rate (None: each adapter's GRPO rate)")
    warm_start_max_per_example: int | None = Field(
        None, ge=1, description="most successes one training example gives one role in the warm start (None: no "
                                "cap): keeps examples the program always solves from filling the batches")


class SamplingConfig(Section):
    """Which examples a step trains on (``compilers.sampling``) and how they are rolled out (``wfc.lower``)."""

    examples_per_step: int = Field(4, ge=1)
    group_size: int = Field(8, ge=2, description="rollouts of the whole program per example")
    temperature: float = Field(1.0, gt=0.0, description="sampling temperature of training rollouts (the update "
                                                        "computes log-probs under it too)")
    max_tokens: int = Field(64, ge=1, description="max new tokens per LM call")
    rollout_workers: int = Field(
        256, ge=1, description="training rollouts in flight at once (threads). Every training call samples with "
                               "a seed of its own (seed, step, example, rollout, role, fan-out branch), so a seeded "
                               "compile draws the same tokens at any setting, float rounding of batch layouts aside; "
                               "at one setting the batches repeat too (wfc.engines.cohort)")
    skip_frozen: bool = Field(
        False, description="training rollouts end at a frozen role's first call (not generated, no tokens spent) "
                           "and are scored on the latest answer before it (wfc.lower, stopped rollouts). For "
                           "frozen revisers after every trained call, under per-call credit (own_output, verified, "
                           "verified-strict): such calls train nothing and no trained call's reward reads them. "
                           "Validation and the artifact run the whole program")
    dynamic_sampling: bool = Field(
        False, description="DAPO: drop examples whose groups all have equal rewards and draw replacements until the "
                           "step holds examples_per_step examples with signal (bounded by max_draw_rounds)")
    max_draw_rounds: int = Field(3, ge=1, description="rollout rounds per step at most (dynamic sampling's budget)")
    scale_partial_steps: bool = Field(
        False, description="dynamic sampling: a step left with fewer than examples_per_step examples with signal "
                           "when its draw rounds run out takes kept / examples_per_step of the learning rate "
                           "(compilers.schedule.partial_step_scale), so a few groups do not take a full-size step")
    max_rollout_tokens: int | None = Field(
        None, ge=1, description="stop training once rollouts (bootstrap included) generated this many completion "
                                "tokens: compares recipes at an equal budget")
    pass_band: tuple[float, float] | None = Field(
        None, description="(lo, hi): skip examples whose running pass rate is <= lo or >= hi; hard ones are replayed")
    replay_after: int = Field(4, ge=1, description="steps before a too-hard example is drawn again")
    curriculum_steps: int = Field(0, ge=0,
                                  description="grow the drawn pool easiest-first to the whole set by this step")
    curriculum_key: str | None = Field(
        None, description="example field giving difficulty for the curriculum (None: trainset order is easiest first)")
    curriculum_start: float = Field(0.3, gt=0.0, le=1.0, description="share of the pool open at step 0")
    pass_rate_probe: int = Field(
        0, ge=0, description="before step 1, run the program this many times (sampled, as in training) on every "
                             "training example and measure its pass rate (costs len(trainset) x this many runs, "
                             "counted in max_rollout_tokens): the rates become the sampler's running pass rates "
                             "(adaptive_rollouts and pass_band act on them from step 1) and, with curriculum_steps "
                             "and no curriculum_key, the curriculum's order (most often passed first); 0: off")
    auto_remedies: bool = Field(
        False, description="before step 1, probe the untrained program (pass_rate_probe runs per training example, "
                           "4 if unset) and switch on the remedies its pass rates call for (compilers.remedies: "
                           "adaptive_rollouts; a warm start on the probe's own passing runs); the choice and its "
                           "reasons are a 'remedies' record in the step log and the manifest")
    adaptive_rollouts: bool = Field(
        False, description="group size per drawn example from its running pass rate (compilers.sampling."
                           "adaptive_group_sizes): the smallest with P(at least one pass) >= adaptive_target, "
                           "between 2 and max_group_size, group_size while the rate is unknown; a draw's groups "
                           "sum to at most adaptive_budget x group_size x examples drawn")
    max_group_size: int = Field(32, ge=2, description="largest group adaptive_rollouts gives an example")
    adaptive_target: float = Field(
        0.8, gt=0.0, lt=1.0, description="chance of at least one pass in a group that adaptive_rollouts sizes for")
    adaptive_budget: float = Field(
        1.0, gt=0.0, description="adaptive_rollouts' rollouts per drawn example on average at most, in units of "
                                 "group_size (1.0: what fixed groups cost, moved from easy examples to hard ones)")

    @model_validator(mode="after")
    def _check_sampling(self):
        if self.pass_band is not None and not (0.0 <= self.pass_band[0] < self.pass_band[1] <= 1.0):
            raise ValueError(f"pass_band must be (lo, hi) with 0 <= lo < hi <= 1, got {self.pass_band}")
        if self.adaptive_rollouts and self.max_group_size < self.group_size:
            raise ValueError(f"max_group_size ({self.max_group_size}) is below group_size ({self.group_size}): "
                             "adaptive_rollouts gives group_size to an example of unknown pass rate; raise "
                             "max_group_size")
        if self.adaptive_rollouts and self.adaptive_budget * self.group_size < 2:
            raise ValueError(f"adaptive_budget={self.adaptive_budget} x group_size={self.group_size} leaves fewer "
                             f"than 2 rollouts per example: use adaptive_budget >= {2 / self.group_size:g}")
        if self.scale_partial_steps and not self.dynamic_sampling:
            raise ValueError("scale_partial_steps scales the steps dynamic sampling leaves short of examples with "
                             "signal, so it does nothing without it: set dynamic_sampling=True too, or drop it")
        return self


class CreditConfig(Section):
    """Scoring a step's rollouts: rewards (``compilers.score``), per-call credit (``compilers.credit``,
    ``compilers.counterfactual``), groups (``compilers.group``) and advantages (``compilers.advantages``)."""

    failure_score: float = Field(0.0, description="reward of every call of a crashed rollout")
    format_failure_score: float = Field(-0.5, description="reward of a call whose output failed to parse")
    metric_failure_score: float | None = Field(
        None, description="reward when the metric raises or returns NaN; None makes that an error")
    overlong_penalty: float = Field(
        0.0, ge=0.0, description="subtracted from the reward of a call cut at max_tokens (compilers.group): "
                                 "teaches roles to finish inside the budget")
    credit: str = Field("inherit",
                        description="inherit | own_output | verified | verified-strict (see compilers.credit)")
    counterfactual_roles: list[str] = Field(
        default_factory=list, description="roles credited counterfactually (CCPO; compilers.counterfactual): each "
                                          "call's reward is the rollout's minus that of a rerun with only it "
                                          "resampled; ['*'] for every role; costs one rerun per credited call")
    grouping: str = Field("ragged", description="truncate | fill | ragged (compilers.group.GROUPING)")
    pool_fanout: bool = Field(
        False, description="one group for a role's calls that saw one same prompt (Voting's k voters x group_size "
                           "rollouts: one baseline over all of them; compilers.group)")
    advantage: str = Field("dr_grpo", description="grpo | dr_grpo | rloo | mc_grpo")
    role_advantage_norm: bool = Field(
        False, description="scale each role's advantages to unit RMS over the step (Dr.MAS): no role's reward scale "
                           "dominates a shared adapter")

    @field_validator("credit", "grouping", "advantage")
    @classmethod
    def _credit_variants(cls, v: str, info: ValidationInfo) -> str:
        return registered(info.field_name, v, REGISTRIES[info.field_name])

    @model_validator(mode="after")
    def _check_credit(self):
        if self.format_failure_score >= self.failure_score:
            raise ValueError(
                f"format_failure_score ({self.format_failure_score}) must be below failure_score "
                f"({self.failure_score}): a call that broke the format should score under a crashed rollout")
        return self

    @property
    def rule(self) -> Credit:
        """The credit rule: sets per-call rewards on a scored rollout."""
        return CREDIT[self.credit]

    @property
    def estimator(self) -> Estimator:
        """The advantage estimator: one group's rewards -> its advantages."""
        return ADVANTAGES[self.advantage]

    @property
    def validation_failure_score(self) -> float:
        """What a raising or NaN metric scores in validation: ``metric_failure_score``, else ``failure_score``."""
        return self.metric_failure_score if self.metric_failure_score is not None else self.failure_score


class UpdateConfig(Section):
    """The update stage (``compilers.update``): the loss (``compilers.loss``), the optimizer and its rate
    (``compilers.schedule``), the importance correction (``compilers.offpolicy``)."""

    learning_rate: float = Field(2e-4, gt=0.0)
    lr_schedule: str = Field(
        "constant", description="shape of the learning rate over the steps (compilers.schedule.SCHEDULES: constant, "
                                "linear, cosine): decays from the base rate after warm-up to min_lr_ratio x base at "
                                "the last step")
    warmup_steps: int = Field(0, ge=0, description="steps ramping the rate linearly up to the base rate")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="the decayed rate at the last step, as a share of "
                                                               "the base rate")
    inner_epochs: int = Field(1, ge=1)
    clip_eps: float = Field(0.2, gt=0.0, lt=1.0)
    clip_eps_high: float | None = Field(None, gt=0.0)
    beta: float = Field(0.0, ge=0.0, description="KL coefficient to the reference (the base with adapters off)")
    loss_aggregation: str = Field("token", description="token | sequence | constant (compilers.loss.AGGREGATIONS)")
    max_grad_norm: float = Field(1.0, gt=0.0)
    token_budget: int = Field(4096, ge=64, description="packed tokens per micro-batch (shared-prefix packing)")
    importance_correction: str = Field(
        "tis", description="tis | none: truncated importance weights for engine/trainer log-prob mismatch "
                           "(compilers.offpolicy.CORRECTIONS)")
    tis_cap: float = Field(2.0, gt=0.0, description="cap of the truncated importance weights")

    @field_validator("lr_schedule", "loss_aggregation", "importance_correction")
    @classmethod
    def _update_variants(cls, v: str, info: ValidationInfo) -> str:
        return registered(info.field_name, v, REGISTRIES[info.field_name])

    @property
    def aggregation(self) -> Aggregation:
        """The loss aggregation: reduces token losses, knows its unit (role mass) and a micro-batch's share."""
        return AGGREGATIONS[self.loss_aggregation]

    @property
    def correction(self) -> ImportanceCorrection:
        """The importance correction: per-token weights of the policy term, or none."""
        return CORRECTIONS[self.importance_correction]


class GuardsConfig(Section):
    """Guards (``compilers.guards``; each on by default where it applies, each visible in the step log)."""

    fanout_scaling: bool = Field(True, description="rows of a role called k times on one input in a rollout weigh 1/k")
    role_balance: bool = Field(True, description="adapters trained by several roles: cap each role's gradient mass")
    role_share_cap: float | None = Field(
        None, gt=0.0, le=1.0, description="most of an adapter's gradient mass one role may hold (None: equal shares)")
    role_clip: bool = Field(True, description="clip each role's gradient before summing roles of one adapter")
    role_max_grad_norm: dict[str, float] = Field(
        default_factory=dict, description="role path -> gradient-norm clip of that role (default max_grad_norm)")
    role_learning_rates: dict[str, float] = Field(
        default_factory=dict, description="role path -> learning rate (roles sharing an adapter must agree)")
    entropy_floor: float | None = Field(
        None, ge=0.0, description="nats per token: a role whose sampled entropy in a step falls below this gets an "
                                  "entropy bonus of entropy_coef in that step's loss (compilers.guards; None: off)")
    entropy_coef: float = Field(0.1, ge=0.0, description="the entropy bonus's coefficient (with entropy_floor)")
    cliff_guard: bool = Field(True, description="roll back to the best revision when validation falls off a cliff")
    cliff_drop: float = Field(0.15, ge=0.0, le=1.0, description="a fall of more than this below the best accuracy")
    cliff_patience: int = Field(2, ge=1, description="... for this many consecutive evaluations is a cliff")
    cliff_lr_factor: float = Field(0.5, gt=0.0, le=1.0, description="learning-rate multiplier after a rollback")

    @model_validator(mode="after")
    def _check_guards(self):
        for name in ("role_max_grad_norm", "role_learning_rates"):
            bad = {k: v for k, v in getattr(self, name).items() if not v > 0}
            if bad:
                raise ValueError(f"{name} values must be > 0, got {bad}")
        return self


class EvalConfig(Section):
    """Validation (greedy, ``compilers.mmgrpo.evaluate``) and which evaluated revision the artifact keeps."""

    eval_max_tokens: int | None = Field(None, ge=1, description="max new tokens per call in validation (default "
                                                                "max_tokens)")
    eval_every: int = Field(5, ge=0, description="validate every N steps (0: only before and after training)")
    keep: Literal["best", "last"] = "best"


@dataclass(frozen=True)
class Sections:
    """One compile's config as its sections, in the order the compile uses them: the one table of which field
    belongs to which section (:data:`SECTIONS`)."""

    run: RunConfig
    engine: EngineConfig
    plan: PlanConfig
    prompts: PromptsConfig
    warm_start: WarmStartConfig
    sampling: SamplingConfig
    credit: CreditConfig
    update: UpdateConfig
    guards: GuardsConfig
    evaluation: EvalConfig


SECTIONS: dict[str, type[Section]] = typing.get_type_hints(Sections)  # section name -> its model, in order
S = TypeVar("S", bound=Section)


# The bases are SECTIONS in reverse: pydantic lists the fields of the last base first, so the fields (and a dump)
# read in the order of SECTIONS.
class MMGRPOConfig(EvalConfig, GuardsConfig, UpdateConfig, CreditConfig, SamplingConfig, WarmStartConfig,
                   PromptsConfig, PlanConfig, EngineConfig, RunConfig):
    """Every knob of a compile: all sections' fields, flat. Stored whole in the artifact's manifest; a stage is given
    its own section (:meth:`section`, :meth:`sections`). The rules here are those across sections."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    def section(self, kind: type[S]) -> S:
        """This config's fields of section ``kind`` (a model of :data:`SECTIONS`), as that section."""
        return kind.model_validate({name: getattr(self, name) for name in kind.model_fields})

    def sections(self) -> Sections:
        return Sections(**{name: self.section(kind) for name, kind in SECTIONS.items()})

    @model_validator(mode="after")
    def _check_across(self):
        if self.skip_frozen and not self.frozen_roles:
            raise ValueError("skip_frozen=True skips the frozen roles' calls in training, but frozen_roles is empty: "
                             "name the roles to freeze, e.g. frozen_roles=['optimizer']")
        if self.skip_frozen and not self.rule.per_call:
            per_call = [repr(name) for name, rule in CREDIT.items() if rule.per_call]
            raise ValueError(f"skip_frozen=True needs per-call credit (credit={', '.join(per_call[:-1])} or "
                             f"{per_call[-1]}): under {self.credit!r} every call trains on the whole program's reward, "
                             "which the skipped calls would change")
        if self.skip_frozen and self.counterfactual_roles:
            raise ValueError("skip_frozen=True with counterfactual_roles: a counterfactual rerun would run the whole "
                             "program, frozen calls included, and score it against a stopped rollout; use one of "
                             "the two")
        if self.student_demos == "internalize" and not self.optimizes.weights:
            raise ValueError(f"student_demos='internalize' fine-tunes the adapters on the student's demos, but "
                             f"strategy={self.strategy!r} trains prompts only: use 'keep' or 'drop', or a strategy "
                             "that trains weights ('w', 'p -> w')")
        if self.warm_start_runs and not self.optimizes.weights:
            raise ValueError(f"warm_start_runs fine-tunes the adapters, but strategy={self.strategy!r} trains prompts "
                             "only: use strategy='p -> w' (or 'w'), or set warm_start_runs=0")
        return self

