"""Checkpoint and resume of an mmGRPO compile: a compile killed midway continues from its last finished step.

Layout below the run directory::

    checkpoint/                         the latest checkpoint, replaced whole after every step (and after step 0)
        checkpoint.json                 step, fingerprint, bookkeeping, sampler and python/numpy RNG states, the
                                        program's DSPy state, the sha256 of every file below and of every referenced
                                        revision, and ``digest``: the sha256 of this JSON without the digest itself
        adapters/<name>.safetensors     every adapter's exact weights after the step
        optimizer.pt                    AdamW state per adapter: moments, step counts, learning rate (after any
                                        cliff cut)
        rng.pt                          torch's global CPU generator (the HF engine samples from it), CUDA's too
    revisions/<step>/<name>.safetensors every evaluated revision (keep-best and cliff-rollback targets), written
                                        once and referenced by the checkpoint with its sha256
    metrics.jsonl                       the log; a resume cuts it back to the records the checkpoint had seen

Invariants:
- a checkpoint directory is written to a temporary sibling and renamed into place (``wfc.artifact._atomic_dir``):
  ``checkpoint/`` is always whole. A kill between the two renames of a replacement leaves the previous checkpoint as
  ``.checkpoint.old-<pid>``; :func:`load` falls back to it.
- everything a step draws from is restored: adapters, optimizer state, the sampler, every RNG, the bookkeeping of
  keep-best and cliff rollback, so a resumed compile repeats what the uninterrupted one would have done (as far as
  the engine itself is deterministic: see docs/resume.md).
- :func:`load` verifies every file against its sha256 and refuses, naming what changed, a checkpoint written for
  another config, base model, role -> adapter plan, trainset, valset, metric or program class
  (:func:`fingerprint`). ``steps`` alone may change (:data:`RESUMABLE`): a resume may train longer or stop earlier;
  where it computes (:data:`PLACEMENT`: ``device``, ``gradient_checkpointing``) is not part of the fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from compilers.state import LoopState  # noqa: F401 (also compilers.checkpoint.LoopState, as before)
from wfc.artifact import _atomic_dir, sha256

FORMAT_VERSION = 1
DIR = "checkpoint"
RESUMABLE = ("steps",)  # config fields a resume may change: anything else would make the run another run
PLACEMENT = ("device", "gradient_checkpointing")  # where the run computes, not what: never part of the fingerprint


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from (missing, corrupted, or written for another run)."""


# ----- what must not change -----------------------------------------------------------------------------------------
def data_fingerprint(examples: Sequence) -> str:
    """sha256 of the examples' fields and input keys, in order."""
    rows = [{"fields": dict(ex.items()), "inputs": sorted(ex.inputs().keys())} for ex in examples]
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint(config, *, base_model: str, base_checksum: str, role_adapters: Mapping[str, str],
                trainset: Sequence, valset: Sequence, metric, program) -> dict[str, Any]:
    """What a resume must find unchanged. ``base_model`` is kept for messages only: a local copy of the same weights
    (same checksum) may resume."""
    cfg = config.model_dump(mode="json")
    return {
        "config": {k: v for k, v in cfg.items() if k not in RESUMABLE + PLACEMENT},
        "base_model": base_model,
        "base_checksum": base_checksum,
        "roles": dict(role_adapters),
        "trainset": data_fingerprint(trainset),
        "valset": data_fingerprint(valset),
        "metric": getattr(metric, "__name__", type(metric).__name__),
        "program": f"{type(program).__module__}:{type(program).__qualname__}",
    }


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def check_fingerprint(saved: Mapping[str, Any], current: Mapping[str, Any], *, where: Path) -> None:
    """CheckpointError naming every difference between the checkpoint's run and this one, and what to do."""
    what: list[str] = []
    old, new = _flat(saved["config"]), _flat(current["config"])
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if changed:
        what.append("config " + ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed))
    if saved["base_checksum"] != current["base_checksum"]:
        what.append(f"base model {saved['base_model']!r} (checksum {saved['base_checksum'][:12]}) -> "
                    f"{current['base_model']!r} (checksum {current['base_checksum'][:12]})")
    if saved["roles"] != current["roles"]:
        what.append(f"role -> adapter plan {saved['roles']} -> {current['roles']}")
    for key in ("trainset", "valset"):
        if saved[key] != current[key]:
            what.append(f"{key} (its examples differ from the ones the run trained with)")
    for key in ("metric", "program"):
        if saved[key] != current[key]:
            what.append(f"{key} {saved[key]!r} -> {current[key]!r}")
    if what:
        raise CheckpointError(
            f"cannot resume from {where}: it was written by a different run; changed: {'; '.join(what)}. Resume with "
            f"the run's own settings (only {', '.join(RESUMABLE)} may change), or start a fresh compile in another "
            "run directory")


@dataclass
class Checkpoint:
    """A verified checkpoint: its directory, its JSON, and the run directory it belongs to."""

    path: Path
    run_dir: Path
    data: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.data["step"])

    @property
    def plan(self) -> dict[str, Any]:
        return self.data["plan"]

    def revision_files(self) -> RevisionFiles:
        files = {int(s): dict(fs) for s, fs in self.data["revisions"].items()}
        return RevisionFiles(files, {rel: self.data["files"][rel] for fs in files.values() for rel in fs.values()})

    def loop_state(self) -> LoopState:
        """The bookkeeping, with every referenced revision read back."""
        from safetensors.torch import load_file

        revisions = {int(step): {a: load_file(str(self.run_dir / rel)) for a, rel in files.items()}
                     for step, files in self.data["revisions"].items()}
        return LoopState.from_json(self.data["loop"], revisions)


# ----- write --------------------------------------------------------------------------------------------------------
def _save_tensors(state: Mapping[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(path), metadata={"format": "pt"})


@dataclass
class RevisionFiles:
    """The evaluated revisions on disk: step -> adapter -> path relative to the run directory, and their sha256."""

    files: dict[int, dict[str, str]] = field(default_factory=dict)
    sha: dict[str, str] = field(default_factory=dict)

    def write(self, run_dir: Path, revisions: Mapping[int, Mapping[str, Mapping[str, torch.Tensor]]]) -> None:
        """Write the revisions not yet on disk, atomically per step (a revision never changes once evaluated)."""
        for step, states in sorted(revisions.items()):
            if step in self.files:
                continue
            with _atomic_dir(run_dir / "revisions" / str(step)) as tmp:
                for adapter, state in states.items():
                    _save_tensors(state, tmp / f"{adapter}.safetensors")
            self.files[step] = {a: f"revisions/{step}/{a}.safetensors" for a in states}
            self.sha.update({rel: sha256(run_dir / rel) for rel in self.files[step].values()})


def _rng_json() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    out: dict[str, Any] = {"python": [version, list(internal), gauss]}
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        out["numpy"] = [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    return out


def torch_rng_state() -> dict[str, Any]:
    """torch's global generators: the CPU one, and CUDA's where CUDA is in use."""
    out: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def save(run_dir: Path, *, loop: LoopState, policy, adapters: Sequence[str], optimizers, sampler, student,
         fingerprint: Mapping[str, Any], plan: Mapping[str, Any], revision_files: RevisionFiles) -> Path:
    """Write the checkpoint of the state after ``loop.step`` (call it between steps: no generation in flight).
    ``policy``: the :class:`wfc.policy.Policy` holding the adapters. ``revision_files`` carries the revisions
    already on disk from call to call."""

    run_dir = Path(run_dir)
    revision_files.write(run_dir, loop.revisions)
    target = run_dir / DIR
    with _atomic_dir(target) as tmp:
        for adapter in adapters:
            _save_tensors(policy.adapter_state(adapter), tmp / "adapters" / f"{adapter}.safetensors")
        torch.save({a: opt.state_dict() for a, opt in optimizers.optimizers.items()}, tmp / "optimizer.pt")
        torch.save(torch_rng_state(), tmp / "rng.pt")
        log_path = run_dir / "metrics.jsonl"
        lines = log_path.read_bytes().splitlines(keepends=True) if log_path.exists() else []
        files = {p.relative_to(tmp).as_posix(): sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        revisions = {str(s): fs for s, fs in revision_files.files.items() if s in loop.revisions}
        files.update({rel: revision_files.sha[rel] for fs in revisions.values() for rel in fs.values()})
        data = {
            "format_version": FORMAT_VERSION,
            "step": loop.step,
            "fingerprint": dict(fingerprint),
            "plan": dict(plan),
            "loop": loop.to_json(),
            "revisions": revisions,
            "sampler": sampler.state_dict(),
            "rng": _rng_json(),
            "program_state": student.dump_state(),
            "learning_rates": {a: optimizers.lr(a) for a in adapters},
            "log": {"records": len(lines), "sha256": hashlib.sha256(b"".join(lines)).hexdigest()},
            "files": files,
        }
        body = json.dumps(data, sort_keys=True, default=str)
        data["digest"] = hashlib.sha256(body.encode()).hexdigest()
        (tmp / "checkpoint.json").write_text(json.dumps(data, sort_keys=True, default=str))
    for stale in run_dir.glob(f".{DIR}.*"):  # leftovers of a write or replacement that was killed midway
        shutil.rmtree(stale, ignore_errors=True)
    return target


# ----- read and restore ---------------------------------------------------------------------------------------------
def find(run_dir: Path) -> Path | None:
    """The checkpoint directory of ``run_dir``: ``checkpoint/``, or the previous one a kill left mid-replacement."""
    run_dir = Path(run_dir)
    if (run_dir / DIR / "checkpoint.json").exists():
        return run_dir / DIR
    old = sorted(run_dir.glob(f".{DIR}.old-*/checkpoint.json"), key=lambda p: p.stat().st_mtime)
    return old[-1].parent if old else None


def load(run_dir: str | Path) -> Checkpoint:
    """Read and verify the checkpoint of ``run_dir``; CheckpointError (saying what to do) when there is none or
    any of its files is truncated, corrupted or missing."""
    run_dir = Path(run_dir)
    path = find(run_dir)
    if path is None:
        raise CheckpointError(f"{run_dir} holds no checkpoint ({DIR}/checkpoint.json): the compile stopped before "
                              "its first one (written after the step-0 validation) or this is not its run "
                              "directory; start a fresh compile, or pass the run directory the compile wrote")
    try:
        data = json.loads((path / "checkpoint.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}/checkpoint.json is unreadable ({exc}): the checkpoint is corrupted; "
                              f"delete {path} to resume from nothing, i.e. start a fresh compile") from None
    if not isinstance(data, dict) or "digest" not in data:
        raise CheckpointError(f"{path}/checkpoint.json is not a wfc checkpoint: start a fresh compile")
    digest = data.pop("digest")
    if hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest() != digest:
        raise CheckpointError(f"{path}/checkpoint.json does not match its digest (corrupted or edited): "
                              "start a fresh compile")
    if data.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {data.get('format_version')}; this wfc resumes format "
                              f"{FORMAT_VERSION}: resume with the wfc version that wrote it")
    for rel, expected in sorted(data["files"].items()):
        file = (path / rel) if not rel.startswith("revisions/") else (run_dir / rel)
        if not file.is_file():
            raise CheckpointError(f"{file} is missing: the checkpoint is incomplete; start a fresh compile")
        if sha256(file) != expected:
            raise CheckpointError(f"{file} does not match its sha256 in {path}/checkpoint.json (truncated or "
                                  "corrupted): the checkpoint cannot be trusted; start a fresh compile")
    return Checkpoint(path=path, run_dir=run_dir, data=data)


def restore_log(ck: Checkpoint) -> list[dict[str, Any]]:
    """Cut ``metrics.jsonl`` back to the records the checkpoint had seen (atomically: a temporary file renamed over
    it) and return this run's records (from its last ``plan`` record on): records of a step the killed run did not
    checkpoint are written again by the resume."""
    path = ck.run_dir / "metrics.jsonl"
    n, expected = ck.data["log"]["records"], ck.data["log"]["sha256"]
    lines = path.read_bytes().splitlines(keepends=True) if path.exists() else []
    kept = lines[:n]
    if len(kept) < n or hashlib.sha256(b"".join(kept)).hexdigest() != expected:
        raise CheckpointError(f"{path} does not start with the {n} records checkpointed with step {ck.step} "
                              "(edited or truncated): restore it, or start a fresh compile")
    if len(lines) > n:
        tmp = path.with_name(f".{path.name}.resume")
        tmp.write_bytes(b"".join(kept))
        tmp.replace(path)
    records = [json.loads(line) for line in kept]
    starts = [i for i, r in enumerate(records) if r.get("kind") == "plan"]
    return records[starts[-1]:] if starts else records


def restore(ck: Checkpoint, *, policy, engine, adapters: Sequence[str], optimizers, sampler,
            student) -> LoopState:
    """Put the checkpointed state back: adapters (exact tensors, into ``policy``; ``engine`` gets them through
    ``load_adapters``), optimizer states, the sampler, the program's state, and, last, every RNG, so nothing drawn
    during setup shifts the streams. Returns the loop's bookkeeping."""
    from safetensors.torch import load_file

    for adapter in adapters:
        policy.restore_adapter(adapter, load_file(str(ck.path / "adapters" / f"{adapter}.safetensors")))
    engine.load_adapters(policy.export(adapters))
    states = torch.load(ck.path / "optimizer.pt", weights_only=True)
    for adapter, opt in optimizers.optimizers.items():
        opt.load_state_dict(states[adapter])
    sampler.load_state_dict(ck.data["sampler"])
    student.load_state(ck.data["program_state"])
    loop = ck.loop_state()
    rng = ck.data["rng"]
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in rng:
        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    saved = torch.load(ck.path / "rng.pt", weights_only=True)
    torch.set_rng_state(saved["cpu"])
    if "cuda" in saved and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
    return loop


def drop_later_revisions(run_dir: Path, step: int) -> None:
    """Remove ``revisions/<s>/`` for s > ``step``: written by the killed run after its last checkpoint, they are
    written again (identically) as the resume passes those steps."""
    for d in (Path(run_dir) / "revisions").glob("*"):
        if d.is_dir() and d.name.isdigit() and int(d.name) > step:
            shutil.rmtree(d, ignore_errors=True)
