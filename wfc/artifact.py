"""The trained artifact: a program plus its adapters and a manifest, which users load, run and serve.

Layout of an artifact directory::

    manifest.json              Manifest (format version, base model id + checksum, roles -> adapters, config, the
                               program's source reference, sha256 of every other file, ...)
    program/state.json         the program's DSPy state (``dump_state``: instructions, demos per predictor)
    program/retrieval.json     the roles' retrieved-demo pools (``wfc.retrieve``), when compile gave them any
    program/structure.json     the program's object tree as data (``wfc.source``): rebuilt without pickle
    program/source/<stem>.py   the program's code when it lives outside installed packages (a script's slice, a
                               sibling module); absent for classes of installed packages (``programs.voting``)
    program/program.pkl        a cloudpickle of the program (DSPy ``save_program=True``), read only when trusted
    adapters/<name>/           standard PEFT adapters (adapter_config.json + adapter_model.safetensors)
    revisions/<step>/<name>/   every evaluated adapter revision (rollback targets)
    metrics.jsonl, curves.png  training history and curves (when trained)

Invariants: directories are written to a temporary sibling and renamed into place (a failed save loses nothing);
``adapters/`` holds the revision named by ``manifest.revision_step``; the role path is the key of the role map;
``manifest.checksums`` holds the sha256 of every file but the manifest, and ``load`` verifies everything under
``program/`` and ``adapters/`` before reading it (a tampered or truncated file is an ``ArtifactError`` naming it).

Loading safely: by default ``load`` runs no code from the artifact. It rebuilds the program from structure.json +
state.json with classes the environment already imports by name. Code shipped in the artifact (program/source/,
program.pkl) runs only with ``trust_code=True`` (CLI ``--trust-code``); ``program_import_path="file.py:factory"``
builds the program from your own code instead.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import dspy
from pydantic import BaseModel, Field

from wfc import retrieve
from wfc.adapter import CompactChatAdapter
from wfc.adapter_files import write_adapter
from wfc.engines.base import SamplingParams
from wfc.engines.hf import HFEngine
from wfc.imports import _is_path, load_program
from wfc.lower import Decoding, bind, copy_program, is_bound, role_grammars, trace
from wfc.policy import Policy, peft_adapter_state, peft_restore_adapter
from wfc.source import ProgramSource, ProgramWrapper, RestoreError, capture, rebuild

log = logging.getLogger(__name__)

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
    program_source: ProgramSource | None = Field(default=None, description="where the program's code lives")
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
    decoding: dict[str, Any] = Field(default_factory=dict, description="wfc.lower.Decoding: structured decoding")
    grammars: dict[str, str | None] = Field(default_factory=dict,
                                            description="role path -> the grammar its calls follow (None: free)")
    package_versions: dict[str, str] = Field(default_factory=dict)
    created_at: str = Field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat())
    checksums: dict[str, str] = Field(default_factory=dict, description="relative path -> sha256, every file")


def package_versions() -> dict[str, str]:
    out = {}
    for pkg in ("wfc", "dspy", "torch", "transformers", "peft", "pydantic"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def adapter_state(model, adapter: str) -> dict[str, Any]:
    """A CPU copy of one adapter's weights (peft's own keying, adapter name stripped). ``model``: a
    :class:`wfc.policy.Policy` (its :meth:`~wfc.policy.Policy.adapter_state`) or a peft model."""
    return model.adapter_state(adapter) if isinstance(model, Policy) else peft_adapter_state(model, adapter)


def restore_adapter(model, adapter: str, state: dict[str, Any]) -> None:
    """Write ``state`` (from :func:`adapter_state`) back into ``adapter`` exactly. ``model``: a
    :class:`wfc.policy.Policy` (which then bumps the adapter's revision) or a peft model."""
    try:
        if isinstance(model, Policy):
            model.restore_adapter(adapter, state)
        else:
            peft_restore_adapter(model, adapter, state)
    except ValueError as exc:
        raise ArtifactError(str(exc)) from exc


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


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _checksums(root: Path, under: str = "") -> dict[str, str]:
    """sha256 of every file below ``root / under`` but the manifest, keyed by its posix path relative to root."""
    base = root / under if under else root
    return {p.relative_to(root).as_posix(): sha256(p) for p in sorted(base.rglob("*"))
            if p.is_file() and p.relative_to(root).as_posix() != "manifest.json"}


def verify(path: Path, manifest: Manifest, *, under: tuple[str, ...] = ("program/", "adapters/"),
           skip: tuple[str, ...] = ("program/program.pkl",)) -> None:
    """Every checksummed file below ``under`` (but ``skip``: the pickle is checked only when it is about to be read)
    exists and matches its sha256; ArtifactError naming the first that does not. Artifacts written before checksums
    existed (none recorded) are not verified."""
    for rel, expected in sorted(manifest.checksums.items()):
        if not rel.startswith(under) or rel in skip:
            continue
        file = path / rel
        if not file.is_file():
            raise ArtifactError(f"{path}: {rel} is missing; the artifact is incomplete: copy it again")
        if sha256(file) != expected:
            raise ArtifactError(f"{path}: {rel} does not match its sha256 in manifest.json (corrupted, truncated or "
                                "tampered with): copy the artifact again from its source")


class CompiledProgram(ProgramWrapper):
    """A program bound to trained adapters on a resident base model. Call it like the original program.

    ``engine`` runs its roles; ``policy`` (a :class:`wfc.policy.Policy`, by default the engine's own when it has
    one, as an ``HFEngine`` does) holds the adapter weights that :meth:`save` writes.

    A ``dspy.Module``: it can be nested in another program (its roles appear under their own dotted paths below the
    attribute that holds it, e.g. ``team.voter``) and compiled again. Run on its own, its roles call this artifact's
    adapters on its engine; inside a program whose predictors a tracer has bound (``wfc.lower.bind``), they follow
    that binding, so the enclosing compile can train them further.
    """

    _SHARED = ("engine", "policy", "manifest", "revisions", "run_dir")  # never deep-copied: a copy runs on the same engine

    def __init__(self, program: dspy.Module, engine, manifest: Manifest, *, policy=None,
                 revisions: dict[int, dict[str, dict[str, Any]]] | None = None, run_dir: Path | None = None):
        super().__init__()
        self.program = copy_program(program)
        self.engine = engine
        self.policy = policy if policy is not None or engine is None else engine.policy
        self.manifest = manifest
        self.revisions = revisions or {}
        self.run_dir = Path(run_dir) if run_dir else None

    def __deepcopy__(self, memo):
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = value if key in self._SHARED else copy.deepcopy(value, memo)
        return new

    def named_parameters(self):
        """The inner program's predictors under their own paths (``voter``, not ``program.voter``)."""
        return self.program.named_parameters()

    @property
    def roles(self) -> dict[str, str | None]:
        return dict(self.manifest.roles)

    def sampling(self) -> SamplingParams:
        return SamplingParams(**self.manifest.sampling)

    def decoding(self) -> Decoding:
        """How this artifact's calls are decoded (structured unless the manifest says otherwise)."""
        return Decoding(**self.manifest.decoding)

    def bound(self) -> dspy.Module:
        """A fresh copy of the program whose roles call their adapters on this artifact's engine."""
        return bind(copy_program(self.program), self.engine, adapters=self.roles, sampling=self.sampling(),
                    decoding=self.decoding())

    def forward(self, **inputs):
        if is_bound(self.program):
            return self.program(**inputs)  # bound by an enclosing program's tracer: its handles route the calls
        # any other LM on the predictors (a dspy optimizer's, a user's set_lm) is not this artifact's: its adapters are
        with dspy.context(adapter=CompactChatAdapter()):
            program = self.bound()
            retrieve.select_demos(program, inputs)  # on the fresh copy: the held program never changes
            return program(**inputs)

    def trace(self, example):
        return trace(self.program, example, self.engine, adapters=self.roles, sampling=self.sampling(),
                     decoding=self.decoding())

    # ----- save ---------------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        target = Path(path)
        program = copy_program(self.program)  # without LM handles a user or a dspy optimizer may have set
        found = capture(program)
        if found.structure is None:
            log.warning("the program will need program_import_path= or trust_code=True to load: %s",
                        found.source.structure_error)
        policy = self.policy
        if policy is None:
            raise ValueError("this CompiledProgram has no policy holding its adapters: build it with "
                             "CompiledProgram(..., policy=policy), as compile and load do")
        with _atomic_dir(target) as tmp:
            _write_pickle(program, tmp / "program", found.local_modules)
            (tmp / "program" / "state.json").write_text(json.dumps(program.dump_state(), default=str, indent=1))
            pools = retrieve.dump(program)
            if pools is not None:
                (tmp / "program" / retrieve.FILE).write_text(json.dumps(pools, default=str, indent=1))
            if found.structure is not None:
                (tmp / "program" / "structure.json").write_text(json.dumps(found.structure, indent=1))
            for rel, text in found.files.items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_text(text)
            for adapter in sorted({a for a in self.roles.values() if a is not None}):
                write_adapter(policy.lora_config(adapter), policy.adapter_state(adapter), tmp / "adapters" / adapter)
            for step, states in sorted(self.revisions.items()):
                for adapter, state in states.items():
                    write_adapter(policy.lora_config(adapter), state, tmp / "revisions" / str(step) / adapter)
            if self.run_dir is not None:
                for name in ("metrics.jsonl", "curves.png", "roles.png"):
                    if (self.run_dir / name).exists():
                        shutil.copy2(self.run_dir / name, tmp / name)
            decoding = self.decoding()
            manifest = self.manifest.model_copy(update={"decoding": decoding.model_dump(),
                                                        "grammars": role_grammars(program, self.sampling(),
                                                                                  decoding),
                                                        "revisions": sorted(self.revisions),
                                                        "program_source": found.source, "checksums": _checksums(tmp)})
            (tmp / "manifest.json").write_text(manifest.model_dump_json(indent=2))
        return target


def _write_pickle(program: dspy.Module, path: Path, local_modules: list) -> None:
    """program/program.pkl for trusted loads (local modules by value, so it unpickles anywhere); skipped, with a
    warning, for programs that do not pickle: the JSON structure is what loads by default."""
    import cloudpickle

    path.mkdir(parents=True, exist_ok=True)
    for module in local_modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        data = cloudpickle.dumps(program)
    except Exception as exc:
        log.warning("program.pkl not written (the program does not pickle: %s)", exc)
        return
    finally:
        for module in local_modules:
            cloudpickle.unregister_pickle_by_value(module)
    (path / "program.pkl").write_bytes(data)


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


def _restore_program(path: Path, manifest: Manifest, *, trust_code: bool,
                     program_import_path: str | None) -> dspy.Module:
    """The program, by the first route that applies: the caller's ``program_import_path``; the recorded structure
    (or class); the recorded import path when it names a module; the pickle, only with ``trust_code``. Then its
    saved state (``program/state.json``) and retrieval pools, when it has any, loaded into it."""
    if program_import_path is not None:
        program = load_program(program_import_path)
    else:
        program = _program_from_artifact(path, manifest, trust_code=trust_code)
    if not isinstance(program, dspy.Module):
        raise ArtifactError(f"{path}: the restored program is a {type(program).__name__}, not a dspy.Module")
    state_file = path / "program" / "state.json"
    try:
        program.load_state(json.loads(state_file.read_text()))
    except (KeyError, ValueError, TypeError) as exc:
        raise ArtifactError(f"{path}: program/state.json does not fit the restored program ({type(exc).__name__}: "
                            f"{exc}); its roles are {sorted(manifest.roles)}") from exc
    pools = path / "program" / retrieve.FILE
    if pools.exists():
        try:
            retrieve.load_into(program, json.loads(pools.read_text()))
        except (ValueError, TypeError, AttributeError) as exc:
            raise ArtifactError(f"{path}: program/{retrieve.FILE} does not fit the restored program "
                                f"({type(exc).__name__}: {str(exc)[:300]}); its roles are {sorted(manifest.roles)}: "
                                "re-save the artifact from the compile run") from exc
    return program


def _program_from_artifact(path: Path, manifest: Manifest, *, trust_code: bool):
    """The program object (state not loaded) by the routes the artifact records: its structure (or class), its
    import path when that names a module, its pickle with ``trust_code``. None works: an ``ArtifactError`` that says
    why and what to pass instead."""
    program, reasons, needs_trust = None, [], False
    if manifest.program_source is not None:
        structure_file = path / "program" / "structure.json"
        structure = json.loads(structure_file.read_text()) if structure_file.exists() else None
        try:
            program = rebuild(manifest.program_source, structure, path, trust_code=trust_code)
        except RestoreError as exc:
            reasons.append(str(exc))
            needs_trust = exc.needs_trust
    recorded = manifest.program_import_path
    local_file = bool(recorded) and _is_path(recorded.rpartition(":")[0])  # a file the artifact names: code
    needs_trust |= program is None and local_file and not trust_code
    if program is None and recorded and (trust_code or not local_file):
        try:
            program = load_program(recorded)
        except ValueError as exc:
            reasons.append(f"program_import_path {recorded!r}: {exc}")
    pickle_file = path / "program" / "program.pkl"
    if program is None and trust_code and pickle_file.exists():
        import cloudpickle

        verify(path, manifest, under=("program/program.pkl",), skip=())
        with open(pickle_file, "rb") as f:
            program = cloudpickle.load(f)
    elif program is None and pickle_file.exists():
        needs_trust = True
    if program is None:
        why = "; ".join(reasons) or "no source reference is recorded"
        trust = (" or trust_code=True (CLI --trust-code) to run the code the artifact ships, if you trust whoever "
                 "made it") if needs_trust else ""
        raise ArtifactError(f"{path}: cannot restore the program ({why}). Pass program_import_path="
                            f"'your_file.py:factory' (CLI --program; a zero-argument function returning the "
                            f"program, {manifest.program_class}){trust}")
    return program


def load(path: str | os.PathLike, *, engine=None, policy=None, model: str | None = None, device: str = "auto",
         trust_code: bool = False, program_import_path: str | None = None) -> CompiledProgram:
    """Load an artifact as a runnable program: its adapters go into a :class:`wfc.policy.Policy`, and the engine
    runs them.

    No ``engine``: a policy (``policy``, else a new one on ``model or manifest.base_model`` and ``device``) and a
    colocated :class:`~wfc.engines.hf.HFEngine` on it. A given ``engine`` receives the artifact's adapters through
    ``engine.load_adapters``; the policy holding them is ``policy``, else the engine's own (an ``HFEngine``), else a
    new one on the engine's base (its loaded ``handle`` where it has one, shared rather than loaded twice).
    ``model`` overrides where the base weights come from (e.g. a local copy); its checksum must still match.
    ``trust_code=True`` allows running code shipped in the artifact (its copied source, its pickle): only for
    artifacts from someone you trust. ``program_import_path`` (``'file.py:factory'``) builds the program from your
    own code instead of the artifact's record; its state is then loaded from program/state.json.
    """
    path = Path(path)
    manifest = read_manifest(path)
    adapters = sorted({a for a in manifest.roles.values() if a is not None})
    for adapter in adapters:
        if not (path / "adapters" / adapter / "adapter_config.json").exists():
            raise ArtifactError(f"{path}: adapter {adapter!r} is missing (adapters/{adapter}/); the artifact is "
                                "incomplete, re-save it from the compile run")
        weights = f"adapters/{adapter}/adapter_model.safetensors"
        if not (path / weights).exists() or (manifest.checksums and weights not in manifest.checksums):
            raise ArtifactError(f"{path}: {weights} is missing or unlisted in manifest.json (wfc loads adapters "
                                "only as checksummed safetensors): re-save the artifact from the compile run")
    verify(path, manifest)
    program = _restore_program(path, manifest, trust_code=trust_code, program_import_path=program_import_path)
    engine_base = engine.handle if engine is not None else None
    if policy is None and engine is not None:
        policy = engine.policy
    if policy is None:
        policy = Policy(model or engine_base or manifest.base_model, device=device)
    held = [("the policy", policy.handle)]
    if engine_base is not None:
        held.append(("the engine", engine_base))
    for who, handle in held:
        if handle.checksum != manifest.base_model_checksum:
            raise ArtifactError(f"{path} was trained on base {manifest.base_model!r} (checksum "
                                f"{manifest.base_model_checksum[:12]}), but {who} holds {handle.name!r} "
                                f"(checksum {handle.checksum[:12]}): load it with model={manifest.base_model!r}")
    for adapter in adapters:
        policy.load_adapter(adapter, str(path / "adapters" / adapter))
    if engine is None:
        engine = HFEngine(policy=policy)
    else:
        engine.load_adapters(policy.export(adapters))
    return CompiledProgram(program, engine, manifest, policy=policy)


def rollback(path: str | os.PathLike, *, step: int) -> Manifest:
    """Make ``adapters/`` hold the stored revision of ``step`` (byte-identical weights). Atomic: the artifact is
    rewritten in a temporary sibling and renamed into place. The revision is verified against its checksums first."""
    path = Path(path)
    manifest = read_manifest(path)
    source = path / "revisions" / str(step)
    if step not in manifest.revisions or not source.is_dir():
        raise ArtifactError(f"{path} has no revision for step {step}; stored revisions: {manifest.revisions}")
    verify(path, manifest, under=(f"revisions/{step}/",))
    with _atomic_dir(path) as tmp:
        shutil.rmtree(tmp)
        shutil.copytree(path, tmp)
        shutil.rmtree(tmp / "adapters")
        shutil.copytree(source, tmp / "adapters")
        event = {"kind": "rollback", "to_step": step, "from_step": manifest.revision_step,
                 "at": _dt.datetime.now(_dt.timezone.utc).isoformat()}
        checksums = manifest.checksums
        if checksums:
            checksums = {k: v for k, v in checksums.items() if not k.startswith("adapters/")}
            checksums.update(_checksums(tmp, "adapters"))
        manifest = manifest.model_copy(update={"revision_step": step, "events": [*manifest.events, event],
                                               "checksums": checksums})
        (tmp / "manifest.json").write_text(manifest.model_dump_json(indent=2))
    return manifest
