"""What a compile checks and chooses before it trains: its run directory, its frozen roles, the policy and the engine,
that every data-parallel rank runs the same compile, and (on the step-0 validation) that ``skip_frozen`` is exact."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from compilers.backends import BackendPlan
from compilers.config import EngineConfig, PlanConfig
from compilers.distributed import Distributed
from wfc.engines import make_engine
from wfc.engines.hf import HFEngine
from wfc.policy import Policy, resolve_device
from wfc.rollout import RolloutGraph


def resume_dir(resume: str | Path | bool | None, run_dir: str | Path | None) -> Path:
    """The run directory: ``resume`` (a path), else ``run_dir``, else a new ``runs/<time>``."""
    if resume is True:
        if run_dir is None:
            raise ValueError("resume=True resumes run_dir, but no run_dir was given: pass resume=RUN_DIR (the run "
                             "directory of the compile to continue)")
        return Path(run_dir)
    if resume:
        if run_dir is not None and Path(run_dir).resolve() != Path(resume).resolve():
            raise ValueError(f"resume={str(resume)!r} and run_dir={str(run_dir)!r} differ: a resumed compile "
                             "continues in its own run directory; pass one of them")
        return Path(resume)
    return Path(run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))


def check_frozen(cfg: PlanConfig, role_paths: list[str]) -> list[str]:
    """The config's frozen roles, checked against the program's roles: each must be one, and one role at least must
    be left to train."""
    unknown = [r for r in cfg.frozen_roles if r not in role_paths]
    if unknown:
        raise ValueError(f"frozen_roles names {unknown}, which the program does not have; its roles are {role_paths}")
    if role_paths and set(cfg.frozen_roles) >= set(role_paths):
        raise ValueError(f"frozen_roles freezes every role ({role_paths}): nothing is left to train; for the program "
                         "as it is, run it uncompiled (or use strategy='p' for demonstrations only)")
    return [r for r in role_paths if r in cfg.frozen_roles]  # program order


def without_frozen(plan: BackendPlan, frozen: Sequence[str]) -> BackendPlan:
    """``plan`` less the frozen roles (an ``auto`` plan is traced over every role)."""
    if not frozen:
        return plan
    kept = {r: a for r, a in plan.role_adapters.items() if r not in frozen}
    return BackendPlan(plan.spec, kept, plan.reasons + [f"frozen (base model, not trained): {list(frozen)}"],
                       role_graph=plan.role_graph)


def check_skippable(graphs: Sequence[RolloutGraph], frozen: Sequence[str], role_map: Mapping[str, Any]) -> None:
    """``skip_frozen`` is exact only when every frozen call comes after every trained call and revises the answer:
    checked on the step-0 validation runs (the whole program, greedy). Raises ``ValueError`` saying which rule broke."""
    for g in graphs:
        calls = sorted(g.calls, key=lambda c: c.started)
        first = next((i for i, c in enumerate(calls) if c.role in frozen), None)
        if first is None:
            continue
        late = sorted({c.role for c in calls[first:] if c.role not in frozen})
        if late:
            raise ValueError(f"skip_frozen: trained role(s) {late} were called after frozen role "
                             f"{calls[first].role!r} in a validation run; skipping would never train those calls. "
                             "Set skip_frozen=False, or freeze only roles that come last")
        if g.outputs:
            fields = set(role_map[calls[first].role].signature.output_fields)
            if not set(g.outputs) <= fields:
                raise ValueError(f"skip_frozen: frozen role {calls[first].role!r} gives {sorted(fields)}, not the "
                                 f"program's answer {sorted(g.outputs)}; a stopped run is scored on the latest "
                                 "answer before it, so only a role that revises the answer can be skipped. Set "
                                 "skip_frozen=False")


def check_same_compile(distributed: Distributed, fingerprint: Mapping[str, Any]) -> None:
    """Every rank must run the same compile (config, base weights, plan, data, metric, program): else the gathered
    steps would mix different problems. ValueError on every rank, naming what differs from rank 0."""
    import json

    mine = json.dumps(fingerprint, sort_keys=True, default=str)
    ranks = distributed.gather([mine])
    bad = {r: f for r, f in enumerate(ranks) if f != ranks[0]}
    if bad:
        first = json.loads(ranks[0])
        r, theirs = next(iter(bad.items()))
        keys = sorted(k for k, v in json.loads(theirs).items() if first.get(k) != v)
        raise ValueError(f"rank {r} of {distributed.world} compiles something else than rank 0 (differs in {keys}): "
                         "launch every rank with the same program, data, config, seed and base model")


def policy_and_engine(engine, policy: Policy | None, model: str, cfg: EngineConfig):
    """The (engine, policy) pair of a compile (see ``MMGRPO.compile``). A policy given or taken from an HF engine
    is used where it lives; an explicit ``cfg.device`` that disagrees with it is a ValueError."""
    if policy is None and isinstance(engine, HFEngine):
        if engine.policy.dtype == getattr(torch, cfg.dtype):
            policy = engine.policy
        else:  # a rollout engine in another dtype (bf16): train a policy of its own, in the config's dtype
            policy = Policy(engine.handle.name, device=cfg.device, dtype=cfg.dtype)
    if policy is None:
        handle = None if engine is None or isinstance(engine, str) else engine.handle
        policy = Policy(handle or model, device=cfg.device, dtype=cfg.dtype)
    elif cfg.device != "auto" and resolve_device(cfg.device) != policy.device:
        raise ValueError(f"device={cfg.device!r} but the policy lives on {policy.device}: build the policy (or the "
                         f"HF engine) with device={cfg.device!r}, or leave device='auto'")
    if cfg.gradient_checkpointing:  # one place for every policy: built here, taken from the engine, or given
        policy.enable_gradient_checkpointing()
    if engine is None or engine == "hf":
        engine = HFEngine(policy=policy)
    elif isinstance(engine, str):  # "vllm" or "vllm-server": its own copy of the base, adapters handed over
        engine = make_engine(engine, policy.handle)  # the loaded base, shared: vLLM reads its path
    return engine, policy
