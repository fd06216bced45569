"""Where a compiled program's code lives, and its structure as data, so an artifact rebuilds it in a fresh process
from any working directory without pickle.

Data model (``ProgramSource``, stored in the manifest; files under ``program/``):

- ``class_ref``: ``module:qualname`` of the program's class as the compiling process saw it (``__main__:TwoRoles``).
- ``program/structure.json``: the program's object tree as tagged JSON (``encode``): every ``dspy.Module`` as its
  class reference plus its attributes; signatures as their fields (name, type, DSPy field extras) and instructions;
  plain values as JSON; a ``ProgramWrapper`` (a nested ``CompiledProgram``) as the program it wraps; a ``dspy.Tool``
  (a ``dspy.ReAct`` agent's ``tools``) as its fields, its ``func`` a reference like a class's (``__main__:add``; the
  ``finish`` tool ReAct makes itself as ``{"$": "react_finish"}``), so the user's tool functions ship and load like
  the user's classes, and each tool's argument schema (``args``, what decoding constrains calls to) is kept. Rebuilding
  makes each object with ``cls.__new__`` and sets its attributes, so a class whose ``__init__`` needs arguments
  (``Voting(signature, n=3)``) is rebuilt without calling it. Absent when the tree holds something that is not data
  (a lambda, a lock, an LM client, a callable object as a tool): ``structure_error`` says what.
- ``sources``: one ``SourceFile`` per module the structure refers to that a fresh process could not import by name:
  ``__main__`` (the script that compiled) or a file outside installed packages (a sibling module of the script).
  Such a file is copied to ``program/source/<stem>.py``; for ``__main__`` only the slice the program needs (imports,
  definitions and assignments its classes and functions use, transitively; never the script's training run or its
  ``if __name__ == "__main__":`` block). Classes of installed packages (``programs.voting:Voting``) are referenced by
  name and not copied.

Trust policy: rebuilding imports modules the loading environment can already import by name; it never executes code
shipped inside the artifact unless asked. A program whose classes live in ``program/source/`` needs
``trust_code=True`` (``RestoreError.needs_trust``), unless this process has (or can import) that module from the
very file the copy was taken from (``same_module``: same name, same sha256 of the whole file), as when a script
loads what it compiled: then its own module is used and no shipped code runs. The artifact's checksums are verified
before anything is read.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import site
import symtable
import sys
import sysconfig
import types
import typing
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any

import dspy
from pydantic import BaseModel, Field

SOURCE_DIR = "program/source"
_PRIVATE_PREFIX = "wfc_artifact_"
_BUILTIN_TYPES = {t.__name__: t for t in (str, int, float, bool, bytes, list, dict, tuple, set, frozenset, object)}
_GENERICS = {"list": list, "dict": dict, "tuple": tuple, "set": set, "frozenset": frozenset, "type": type}
_TOOL_FIELDS = ("name", "desc", "args", "arg_desc", "has_kwargs")  # dspy.Tool's data besides func and arg_types
_REACT_FINISH = ("dspy.predict.react", "ReAct.__init__.<locals>.<lambda>")  # where ReAct defines its finish tool


class RestoreError(ValueError):
    """The program cannot be rebuilt from its recorded source; ``needs_trust`` when trusting the artifact's code
    (``trust_code=True``) would allow it."""

    def __init__(self, message: str, *, needs_trust: bool = False):
        super().__init__(message)
        self.needs_trust = needs_trust


class Unsupported(ValueError):
    """A part of the program that cannot be written as data (the structure is then not stored)."""


class SourceFile(BaseModel):
    module: str = Field(description="the module name in the compiling process (__main__, mymod, ...)")
    path: str = Field(description="artifact-relative path of the copy, program/source/<stem>.py")
    origin: str = Field(description="the file it was copied from (information only)")
    sliced: bool = Field(default=False, description="only the definitions the program needs (scripts)")
    origin_sha256: str | None = Field(default=None, description="sha256 of the whole origin file at compile time")


class ProgramSource(BaseModel):
    class_ref: str
    sources: list[SourceFile] = Field(default_factory=list)
    structure_error: str | None = None


@dataclass
class Captured:
    """What ``capture`` found: the manifest entry, the structure (or None) and the files to write."""

    source: ProgramSource
    structure: dict[str, Any] | None
    files: dict[str, str] = field(default_factory=dict)  # artifact-relative path -> text
    local_modules: list[types.ModuleType] = field(default_factory=list)  # for a by-value pickle


# ----- where code lives ---------------------------------------------------------------------------------------------
def _site_dirs() -> list[Path]:
    dirs = set(site.getsitepackages()) | {site.getusersitepackages()}
    dirs |= {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return [Path(d).resolve() for d in dirs if d]


def is_installed(module: types.ModuleType) -> bool:
    """Whether a fresh process of this environment imports ``module`` by name from any directory: stdlib, files
    under site-packages, or a top-level package of an installed distribution (editable installs included)."""
    name = module.__name__
    if name == "__main__" or name.startswith(("wfc_user_", _PRIVATE_PREFIX)):
        return False
    top = name.split(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return True
    file = getattr(module, "__file__", None)
    if file is None:
        return False
    path = Path(file).resolve()
    if any(path.is_relative_to(d) for d in _site_dirs()):
        return True
    return top in importlib.metadata.packages_distributions()


def ref(obj: Any) -> str:
    """``module:qualname`` of a module-level class or function; Unsupported for local or unreachable objects."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise Unsupported(f"{obj!r} is not defined at module level")
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not obj:
        raise Unsupported(f"{obj!r} is not reachable as {module}:{qualname}")
    return f"{module}:{qualname}"


# ----- structure as tagged JSON -------------------------------------------------------------------------------------
class ProgramWrapper(dspy.Module):
    """A module that stands for the program it holds in ``program`` (``wfc.artifact.CompiledProgram``: that program
    plus the engine and weights it runs on, which are not structure). Nested in a program, it is stored as
    ``program``: the outer artifact drives the roles."""

    program: dspy.Module


def react_finish() -> str:
    """The ``finish`` tool's function of a rebuilt ``dspy.ReAct`` (ReAct's own is a lambda in its ``__init__``)."""
    return "Completed."


class _Encoder:
    def __init__(self):
        self.ids: dict[int, int] = {}
        self.modules: set[str] = set()  # module names the structure refers to

    def ref(self, obj: Any) -> str:
        r = ref(obj)
        self.modules.add(r.split(":")[0])
        return r

    def type(self, t: Any, where: str) -> Any:
        if t is None or t is type(None):
            return "None"
        if t is typing.Any:
            return "Any"
        if isinstance(t, type) and _BUILTIN_TYPES.get(t.__name__) is t:
            return t.__name__
        origin, args = typing.get_origin(t), typing.get_args(t)
        if origin is typing.Literal:
            if not all(isinstance(a, (str, int, float, bool)) or a is None for a in args):
                raise Unsupported(f"{where}: Literal{list(args)} holds values that are not JSON")
            return {"literal": list(args)}
        if origin in (typing.Union, types.UnionType):
            return {"union": [self.type(a, where) for a in args]}
        if origin is not None and getattr(origin, "__name__", None) in _GENERICS:
            return {"generic": origin.__name__, "args": ["..." if a is Ellipsis else self.type(a, where) for a in args]}
        if isinstance(t, type):
            return {"ref": self.ref(t)}
        raise Unsupported(f"{where}: the type {t!r}")

    def signature(self, sig: type[dspy.Signature], where: str) -> dict[str, Any]:
        fields = []
        for name, info in sig.fields.items():
            extra = dict(info.json_schema_extra or {})
            bad = [k for k, v in extra.items() if not isinstance(v, (str, int, float, bool, type(None)))]
            if bad:
                raise Unsupported(f"{where}.{name}: field option(s) {bad} hold code, not data")
            fields.append({"name": name, "type": self.type(info.annotation, f"{where}.{name}"), "extra": extra})
        return {"$": "signature", "name": sig.__name__, "instructions": sig.instructions, "fields": fields}

    def tool(self, tool: dspy.Tool, where: str) -> dict[str, Any]:
        func = tool.func
        if (getattr(func, "__module__", None), getattr(func, "__qualname__", None)) == _REACT_FINISH or \
                func is react_finish:
            encoded: Any = {"$": "react_finish"}
        elif isinstance(func, (types.FunctionType, dspy.Module)):
            encoded = self.value(func, f"{where}.func")
        else:
            raise Unsupported(f"{where}.func is a {type(func).__module__}.{type(func).__qualname__}, not a function "
                              "defined at module level (wrap it in one: def search(query: str) -> list[str]: ...)")
        arg_types = None if tool.arg_types is None else {
            k: self.type(t, f"{where}.arg_types[{k!r}]") for k, t in tool.arg_types.items()}
        return {"$": "tool", "func": encoded, "arg_types": arg_types,
                **{k: self.value(getattr(tool, k), f"{where}.{k}") for k in _TOOL_FIELDS}}

    def value(self, x: Any, where: str) -> Any:
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [self.value(v, f"{where}[{i}]") for i, v in enumerate(x)]
        if isinstance(x, tuple):
            return {"$": "tuple", "items": [self.value(v, f"{where}[{i}]") for i, v in enumerate(x)]}
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                raise Unsupported(f"{where}: a dict with non-string keys")
            return {"$": "dict", "items": {k: self.value(v, f"{where}[{k!r}]") for k, v in x.items()}}
        if isinstance(x, type) and issubclass(x, dspy.Signature):
            return self.signature(x, where)
        if isinstance(x, ProgramWrapper):  # nested: stored as the program it wraps
            return self.value(x.program, where)
        if isinstance(x, dspy.Module):
            if id(x) in self.ids:
                return {"$": "same", "id": self.ids[id(x)]}
            self.ids[id(x)] = n = len(self.ids)
            attrs = {}
            for k, v in vars(x).items():
                if k == "history":
                    continue  # runtime call history
                if k == "wfc_retriever":
                    continue  # a role's retrieved-demo pool: program/retrieval.json holds it (wfc.retrieve)
                attrs[k] = None if k == "lm" else self.value(v, f"{where}.{k}")  # wfc binds LM handles per run
            return {"$": "module", "id": n, "class": self.ref(type(x)), "attrs": attrs}
        if isinstance(x, dspy.Tool):
            return self.tool(x, where)
        if isinstance(x, dspy.Example):
            inputs = x._input_keys
            return {"$": "example", "store": self.value(dict(x._store), where),
                    "inputs": sorted(inputs) if inputs is not None else None}
        if isinstance(x, (type, types.FunctionType)):
            return {"$": "ref", "ref": self.ref(x)}
        if typing.get_origin(x) is not None:
            return {"$": "type", "type": self.type(x, where)}
        raise Unsupported(f"{where} holds a {type(x).__module__}.{type(x).__qualname__}, which is not data")


class _Decoder:
    def __init__(self, resolve):
        self.resolve = resolve
        self.objects: dict[int, Any] = {}

    def type(self, t: Any) -> Any:
        if t == "None":
            return type(None)
        if t == "Any":
            return typing.Any
        if isinstance(t, str):
            return _BUILTIN_TYPES[t]
        if "literal" in t:
            return typing.Literal[tuple(t["literal"])]
        if "union" in t:
            return reduce(lambda a, b: typing.Union[a, b], [self.type(a) for a in t["union"]])
        if "generic" in t:
            args = tuple(Ellipsis if a == "..." else self.type(a) for a in t["args"])
            base = _GENERICS[t["generic"]]
            return base[args] if args else base
        return self.resolve(t["ref"])

    def value(self, x: Any) -> Any:
        if isinstance(x, list):
            return [self.value(v) for v in x]
        if not isinstance(x, dict):
            return x
        tag = x["$"]
        if tag == "tuple":
            return tuple(self.value(v) for v in x["items"])
        if tag == "dict":
            return {k: self.value(v) for k, v in x["items"].items()}
        if tag == "signature":
            from pydantic import Field as PydanticField

            fields = {f["name"]: (self.type(f["type"]), PydanticField(json_schema_extra=dict(f["extra"])))
                      for f in x["fields"]}
            return dspy.Signature(fields, x["instructions"], signature_name=x["name"])
        if tag == "same":
            return self.objects[x["id"]]
        if tag == "module":
            cls = self.resolve(x["class"])
            if not (isinstance(cls, type) and issubclass(cls, dspy.Module)):
                raise RestoreError(f"{x['class']} is not a dspy.Module class; the structure is not wfc's")
            obj = cls.__new__(cls)
            self.objects[x["id"]] = obj
            obj.__dict__.update({k: self.value(v) for k, v in x["attrs"].items()})
            obj.__dict__.setdefault("callbacks", [])
            obj.history = []
            return obj
        if tag == "example":
            ex = dspy.Example(**self.value(x["store"]))
            return ex.with_inputs(*x["inputs"]) if x["inputs"] is not None else ex
        if tag == "ref":
            return self.resolve(x["ref"])
        if tag == "react_finish":
            return react_finish
        if tag == "tool":  # fields as saved: no re-inference from the function, so the argument schema is the same
            arg_types = x["arg_types"]
            return dspy.Tool.model_construct(
                func=self.value(x["func"]),
                arg_types={k: self.type(t) for k, t in arg_types.items()} if arg_types is not None else None,
                **{k: self.value(x[k]) for k in _TOOL_FIELDS})
        if tag == "type":
            return self.type(x["type"])
        raise RestoreError(f"unknown structure tag {tag!r}: the artifact was written by a newer wfc")


# ----- the __main__ slice -------------------------------------------------------------------------------------------
def _names(stmt: ast.stmt) -> tuple[set[str], set[str]]:
    """(names the top-level statement binds, global names it reads, inside functions and classes too)."""
    table = symtable.symtable(ast.unparse(stmt), "<slice>", "exec")
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    used: set[str] = set()

    def walk(t):
        for s in t.get_symbols():
            if s.is_referenced() and (t.get_type() == "module" or s.is_global()):
                used.add(s.get_name())
        for child in t.get_children():
            walk(child)

    walk(table)
    return bound, used


def _is_main_guard(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and "__name__" in ast.unparse(stmt.test) and "__main__" in ast.unparse(stmt.test)


def slice_source(text: str, needed: set[str]) -> str:
    """The statements of a script that define ``needed`` and what they use, transitively, in their order: imports,
    definitions, assignments. Expression statements (calls: the training run) and the main guard are left out."""
    body = ast.parse(text).body
    info = [(i, *_names(s)) for i, s in enumerate(body) if not _is_main_guard(s) and not isinstance(s, ast.Expr)]
    keep = {i for i, s in enumerate(body) if isinstance(s, ast.ImportFrom) and s.module == "__future__"}
    need, changed = set(needed), True
    while changed:
        changed = False
        for i, bound, used in info:
            if i not in keep and bound & need:
                keep.add(i)
                changed |= bool(used - need)
                need |= used
    missing = set(needed) - {n for i, b, _ in info if i in keep for n in b}
    if missing:
        raise Unsupported(f"the script does not define {sorted(missing)} at top level")
    header = "# The part of the compiling script that the program needs (written by wfc; see wfc/source.py).\n"
    return header + "\n\n".join(ast.unparse(body[i]) for i in sorted(keep)) + "\n"


# ----- capture and rebuild ------------------------------------------------------------------------------------------
def capture(program: dspy.Module) -> Captured:
    """The program's class reference, its structure (or why not) and the source files a fresh process needs."""
    class_ref = f"{type(program).__module__}:{type(program).__qualname__}"
    enc = _Encoder()
    try:
        structure: dict[str, Any] | None = {"format": 1, "program": enc.value(program, "program")}
        error = None
    except Unsupported as exc:
        structure, error = None, str(exc)
        enc.modules.add(type(program).__module__)  # and those met before the failure: the pickle needs them too
    files: dict[str, str] = {}
    sources: list[SourceFile] = []
    local: list[types.ModuleType] = []
    for name in sorted(enc.modules):
        module = sys.modules.get(name)
        if module is None or is_installed(module):
            continue
        file = getattr(module, "__file__", None)
        if not file or not Path(file).is_file():
            reason = f"{name} has no source file (an interactive session?): define the program's classes in a .py file"
            return Captured(ProgramSource(class_ref=class_ref, structure_error=error or reason), None)
        text = Path(file).read_text()
        sliced = name == "__main__"
        if sliced:
            try:
                text = slice_source(text, {r.split(":")[1].split(".")[0] for r in _refs_into(structure, name)}
                                    or {type(program).__qualname__.split(".")[0]})
            except (Unsupported, SyntaxError) as exc:
                error = error or f"{file}: {exc}"
                continue
        stem = Path(file).stem
        path = f"{SOURCE_DIR}/{stem}.py"
        while path in files:
            stem += "_"
            path = f"{SOURCE_DIR}/{stem}.py"
        files[path] = text
        sources.append(SourceFile(module=name, path=path, origin=str(Path(file).resolve()), sliced=sliced,
                                  origin_sha256=_file_sha256(Path(file))))
        local.append(module)
    if error is not None:
        structure = None
    return Captured(ProgramSource(class_ref=class_ref, sources=sources, structure_error=error), structure, files,
                    local)


def _refs_into(tree: Any, module: str) -> set[str]:
    out: set[str] = set()
    if isinstance(tree, dict):
        for k, v in tree.items():
            if k in ("class", "ref") and isinstance(v, str) and v.startswith(module + ":"):
                out.add(v)
            out |= _refs_into(v, module)
    elif isinstance(tree, list):
        for v in tree:
            out |= _refs_into(v, module)
    return out


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def same_module(name: str, src: SourceFile) -> types.ModuleType | None:
    """This process's own module ``name`` when its file is byte for byte the one ``src`` was copied from (its
    ``origin_sha256``), else None: the compiling script's module when the same script loads what it saved, or the
    user's module importable from here. Using it runs the user's own code, never the artifact's copy. A module not
    yet imported is imported only after its file's checksum matched."""
    if src.origin_sha256 is None:
        return None
    module = sys.modules.get(name)
    if module is None:
        if name == "__main__":
            return None
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        origin = Path(spec.origin) if spec is not None and spec.origin else None
        if origin is None or not origin.is_file() or _file_sha256(origin) != src.origin_sha256:
            return None
        return importlib.import_module(name)
    file = getattr(module, "__file__", None)
    if not file or not Path(file).is_file() or _file_sha256(Path(file)) != src.origin_sha256:
        return None
    return module


class Resolver:
    """``module:qualname`` -> object: installed modules by name; modules of ``sources`` from their artifact copy
    (imported under a private name), only with ``trust_code``. While a copy runs, the other shipped modules it
    imports by their original names (the script's ``from calc_lib import multiply``) are those names in
    ``sys.modules``, and only then: the loading process's own modules of those names come back afterwards."""

    def __init__(self, source: ProgramSource, root: Path, *, trust_code: bool):
        self.files = {s.module: s for s in source.sources}
        self.root, self.trust_code = Path(root), trust_code
        self.loaded: dict[str, types.ModuleType] = {}

    def module(self, name: str) -> types.ModuleType:
        if name in self.loaded:
            return self.loaded[name]
        src = self.files.get(name)
        local = same_module(name, src) if src is not None else None
        if local is not None:
            module = local  # the very file the artifact's copy came from, this process's own: no artifact code runs
        elif src is None:
            try:
                module = importlib.import_module(name)
            except ImportError as exc:
                raise RestoreError(f"the program needs module {name!r}, which this environment cannot import "
                                   f"({exc}): install it") from exc
        elif not self.trust_code:
            raise RestoreError(f"the program's code ({name}) ships inside the artifact as {src.path}; importing it "
                               "runs that code", needs_trust=True)
        else:
            module = self._import_copy(src)
        self.loaded[name] = module
        return module

    def _import_copy(self, src: SourceFile) -> types.ModuleType:
        file = self.root / src.path
        digest = hashlib.sha256(file.read_bytes()).hexdigest()[:12]
        name = f"{_PRIVATE_PREFIX}{Path(src.path).stem}_{digest}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        self.loaded[src.module] = module  # shipped modules importing each other see it partly run, as in Python
        try:
            with self._shipped_imports(file.read_text(), but=src.module):
                spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name], self.loaded[src.module]
            if isinstance(exc, RestoreError):
                raise
            raise RestoreError(f"importing {src.path} (copied from {src.origin}) failed: {type(exc).__name__}: "
                               f"{exc}") from exc
        return module

    @contextlib.contextmanager
    def _shipped_imports(self, text: str, *, but: str):
        """The shipped modules that ``text`` imports, under their own names in ``sys.modules`` for the block."""
        imported = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module)
        names = sorted(n for n in imported & set(self.files) if n not in ("__main__", but))
        before = {n: sys.modules.get(n) for n in names}
        sys.modules.update({n: self.module(n) for n in names})
        try:
            yield
        finally:
            for n, old in before.items():
                if old is None:
                    sys.modules.pop(n, None)
                else:
                    sys.modules[n] = old

    def __call__(self, spec: str) -> Any:
        name, _, qualname = spec.partition(":")
        obj: Any = self.module(name)
        for part in qualname.split("."):
            if not hasattr(obj, part):
                raise RestoreError(f"{name} has no attribute {qualname!r} (the code changed since compile?)")
            obj = getattr(obj, part)
        return obj


def rebuild(source: ProgramSource, structure: dict[str, Any] | None, root: Path, *,
            trust_code: bool) -> dspy.Module:
    """The program, rebuilt from its structure (or, without one, its class called with no arguments)."""
    resolve = Resolver(source, root, trust_code=trust_code)
    if structure is not None:
        if structure.get("format") != 1:
            raise RestoreError(f"structure format {structure.get('format')!r} is newer than this wfc: upgrade wfc")
        program = _Decoder(resolve).value(structure["program"])
    else:
        cls = resolve(source.class_ref)
        try:
            program = cls()
        except TypeError as exc:
            raise RestoreError(f"{source.class_ref} was not stored as data ({source.structure_error}) and cannot "
                               f"be built without arguments ({exc})") from exc
    if not isinstance(program, dspy.Module):
        raise RestoreError(f"{source.class_ref} did not rebuild into a dspy.Module")
    return program
