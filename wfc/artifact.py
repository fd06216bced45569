"""The trained artifact: a program plus its adapters and a manifest, which users load, run and serve.

Layout of an artifact directory::

    manifest.json              Manifest (format version, base model id + checksum, roles -> adapters, config, ...)
    program/                   the DSPy program (dspy ``save_program=True``) and program/state.json (its DSPy state)
    adapters/<name>/           standard PEFT adapters (adapter_config.json + adapter_model.safetensors)
    revisions/<step>/<name>/   every evaluated adapter revision (rollback targets)
    metrics.jsonl, curves.png  training history and curves (when trained)

Invariants: directories are written to a temporary sibling and renamed into place (a failed save loses nothing);
``adapters/`` holds the revision named by ``manifest.revision_step``; the role path is the key of the role map.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import dspy
from pydantic import BaseModel, Field

from wfc.adapter import CompactChatAdapter
from wfc.engines.base import SamplingParams

FORMAT_VERSION = 1


class ArtifactError(ValueError):
    """An artifact that cannot be loaded as asked (wrong base model, missing adapter, newer format, ...)."""


class Manifest(BaseModel):
    format_version: int = FORMAT_VERSION
    name: str
    base_model: str
    base_model_checksum: str
    program_import_path: str | None = None
    program_class: str
    roles: dict[str, str | None] = Field(description="role path -> adapter name (None: the base model)")
    backend: Any = "shared"
    backend_reasons: list[str] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)
    history: list[dict[str, Any]] = Field(default_factory=list)
    best_step: int | None = None
    revision_step: int | None = None
    revisions: list[int] = Field(default_factory=list)
    events: list[dict[str, Any]] = Field(default_factory=list)
    sampling: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0.0, "max_tokens": 64})
    package_versions: dict[str, str] = Field(default_factory=dict)
    created_at: str = Field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat())


def package_versions() -> dict[str, str]:
    out = {}
    for pkg in ("wfc", "dspy", "torch", "transformers", "peft", "pydantic"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def adapter_state(model, adapter: str) -> dict[str, Any]:
    """A CPU copy of one adapter's weights (peft's own keying, adapter name stripped)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(model, adapter_name=adapter).items()}


def restore_adapter(model, adapter: str, state: dict[str, Any]) -> None:
    """Write ``state`` (from :func:`adapter_state`) back into ``adapter`` exactly."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state, adapter_name=adapter)
    unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if unexpected:
        raise ArtifactError(f"adapter {adapter!r}: unexpected weights {unexpected[:3]}")


def write_adapter(model, adapter: str, state: dict[str, Any], path: Path) -> None:
    """Write one adapter in standard PEFT format (loadable by peft and vLLM as it is)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    config = model.peft_config[adapter]
    config.save_pretrained(str(path))
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "adapter_model.safetensors"),
              metadata={"format": "pt"})


@contextlib.contextmanager
def _atomic_dir(target: Path):
    """Yield an empty sibling directory of ``target``; on success it replaces ``target`` in one rename (the old one
    is removed after), on any error it is deleted and ``target`` is untouched."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


def _import_object(path: str):
    from wfc.imports import load_object

    return load_object(path)


class CompiledProgram:
    """A program bound to trained adapters on a resident base model. Call it like the original program."""

    def __init__(self, program: dspy.Module, engine, manifest: Manifest, *,
                 revisions: dict[int, dict[str, dict[str, Any]]] | None = None, run_dir: Path | None = None):
        from wfc.lower import copy_program

        self.program = copy_program(program)
        self.engine = engine
        self.manifest = manifest
        self.revisions = revisions or {}
        self.run_dir = Path(run_dir) if run_dir else None

    @property
    def roles(self) -> dict[str, str | None]:
        return dict(self.manifest.roles)

    def sampling(self) -> SamplingParams:
        return SamplingParams(**self.manifest.sampling)

    def bound(self) -> dspy.Module:
        """A fresh copy of the program whose roles call their adapters on this artifact's engine."""
        from wfc.lower import bind, copy_program

        return bind(copy_program(self.program), self.engine, adapters=self.roles, sampling=self.sampling())

    def __call__(self, **inputs):
        with dspy.context(adapter=CompactChatAdapter()):
            return self.bound()(**inputs)

    def trace(self, example):
        from wfc.lower import trace

        return trace(self.program, example, self.engine, adapters=self.roles, sampling=self.sampling())

    # ----- save ---------------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        target = Path(path)
        with _atomic_dir(target) as tmp:
            model = self.engine.model
            self.program.save(str(tmp / "program"), save_program=True)
            (tmp / "program" / "state.json").write_text(json.dumps(self.program.dump_state(), default=str, indent=1))
            for adapter in sorted({a for a in self.roles.values() if a is not None}):
                write_adapter(model, adapter, adapter_state(model, adapter), tmp / "adapters" / adapter)
            for step, states in sorted(self.revisions.items()):
                for adapter, state in states.items():
                    write_adapter(model, adapter, state, tmp / "revisions" / str(step) / adapter)
            if self.run_dir is not None:
                for name in ("metrics.jsonl", "curves.png", "roles.png"):
                    if (self.run_dir / name).exists():
                        shutil.copy2(self.run_dir / name, tmp / name)
            manifest = self.manifest.model_copy(update={"revisions": sorted(self.revisions)})
            (tmp / "manifest.json").write_text(manifest.model_dump_json(indent=2))
        return target


def read_manifest(path: str | os.PathLike) -> Manifest:
    path = Path(path)
    mf = path / "manifest.json"
    if not mf.exists():
        raise ArtifactError(f"{path} is not a wfc artifact (no manifest.json): pass the directory compile saved")
    data = json.loads(mf.read_text())
    version = data.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ArtifactError(f"{path} has format version {version}; this wfc reads up to {FORMAT_VERSION}: "
                            "upgrade wfc to load it")
    return Manifest.model_validate(data)


def load(path: str | os.PathLike, *, engine=None, model: str | None = None) -> CompiledProgram:
    """Load an artifact as a runnable program on the HF engine (or the given engine).

    ``model`` overrides where the base weights come from (e.g. a local copy); its checksum must still match.
    """
    from wfc.engines.hf import HFEngine

    path = Path(path)
    manifest = read_manifest(path)
    for adapter in sorted({a for a in manifest.roles.values() if a is not None}):
        if not (path / "adapters" / adapter / "adapter_config.json").exists():
            raise ArtifactError(f"{path}: adapter {adapter!r} is missing (adapters/{adapter}/); the artifact is "
                                "incomplete, re-save it from the compile run")
    if engine is None:
        engine = HFEngine(model or manifest.base_model)
    checksum = engine.handle.checksum
    if checksum != manifest.base_model_checksum:
        raise ArtifactError(f"{path} was trained on base {manifest.base_model!r} (checksum "
                            f"{manifest.base_model_checksum[:12]}), but the engine holds {engine.handle.name!r} "
                            f"(checksum {checksum[:12]}): load it with model={manifest.base_model!r}")
    program = None
    try:
        program = dspy.load(str(path / "program"), allow_pickle=True)
    except Exception as exc:
        if not manifest.program_import_path:
            raise ArtifactError(f"{path}: cannot restore the program ({exc}) and no import path is recorded") from exc
    if program is None:
        obj = _import_object(manifest.program_import_path)
        program = obj() if callable(obj) and not isinstance(obj, dspy.Module) else obj
        program.load_state(json.loads((path / "program" / "state.json").read_text()))
    for adapter in sorted({a for a in manifest.roles.values() if a is not None}):
        engine.load_adapter(adapter, str(path / "adapters" / adapter))
    return CompiledProgram(program, engine, manifest)


def rollback(path: str | os.PathLike, *, step: int) -> Manifest:
    """Make ``adapters/`` hold the stored revision of ``step`` (byte-identical weights). Atomic: the artifact is
    rewritten in a temporary sibling and renamed into place."""
    path = Path(path)
    manifest = read_manifest(path)
    source = path / "revisions" / str(step)
    if step not in manifest.revisions or not source.is_dir():
        raise ArtifactError(f"{path} has no revision for step {step}; stored revisions: {manifest.revisions}")
    with _atomic_dir(path) as tmp:
        shutil.rmtree(tmp)
        shutil.copytree(path, tmp)
        shutil.rmtree(tmp / "adapters")
        shutil.copytree(source, tmp / "adapters")
        event = {"kind": "rollback", "to_step": step, "from_step": manifest.revision_step,
                 "at": _dt.datetime.now(_dt.timezone.utc).isoformat()}
        manifest = manifest.model_copy(update={"revision_step": step, "events": [*manifest.events, event]})
        (tmp / "manifest.json").write_text(manifest.model_dump_json(indent=2))
    return manifest
