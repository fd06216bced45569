"""Loading user objects (programs, metrics, tasks) from an import spec given on the command line.

A spec is ``SOURCE:ATTR``:
- ``SOURCE`` is a Python file path (``examples/math_voting.py``: ends in ``.py`` or holds a path separator) or a
  dotted module name (``mypkg.programs``), imported the usual way;
- ``ATTR`` is an attribute path inside it, possibly dotted (``programs.voting`` -> ``getattr`` twice).

A file is imported under a private module name (``wfc_user_<stem>``) and registered in ``sys.modules``, so classes
defined in it pickle and deep-copy normally. Every failure is a :class:`LoadError` (a ``ValueError``) whose message
names the spec and says what to fix; the user's own import-time exception is chained, never swallowed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import dspy

from wfc.lower import roles


class LoadError(ValueError):
    """An import spec that could not be resolved to an object."""


def split_spec(spec: str) -> tuple[str, str]:
    """``'a/b.py:obj.attr'`` -> ``('a/b.py', 'obj.attr')``. The last colon splits (Windows drive letters survive)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise LoadError(f"import spec {spec!r} needs the form 'path/to/file.py:name' or 'package.module:name'")
    source, _, attr = spec.rpartition(":")
    if not source or not attr or not all(part.isidentifier() for part in attr.split(".")):
        raise LoadError(f"import spec {spec!r}: expected 'SOURCE:NAME' with NAME a (dotted) Python identifier")
    return source, attr


def _is_path(source: str) -> bool:
    return source.endswith(".py") or os.sep in source or "/" in source


def import_file(path: str | Path) -> Any:
    """Import a Python file as a module (re-importing the same path returns the module already loaded)."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise LoadError(f"no such Python file: {path}")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"wfc_user_{path.stem.replace('-', '_')}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise LoadError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def import_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise LoadError(f"no module named {name!r}: check the spelling, or pass a file path like "
                            f"'path/to/file.py:name'") from exc
        raise LoadError(f"importing {name!r} failed: {exc}") from exc
    except Exception as exc:
        raise LoadError(f"importing {name!r} failed: {type(exc).__name__}: {exc}") from exc


def load_object(spec: str) -> Any:
    """The object named by ``spec`` (see module docstring)."""
    source, attr = split_spec(spec)
    module = import_file(source) if _is_path(source) else import_module(source)
    obj: Any = module
    walked = []
    for part in attr.split("."):
        if not hasattr(obj, part):
            where = f"{source}:{'.'.join(walked)}" if walked else source
            public = sorted(n for n in dir(obj) if not n.startswith("_"))
            hint = f"; it defines {', '.join(public[:20])}" + (" ..." if len(public) > 20 else "") if public else ""
            raise LoadError(f"{where} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
        walked.append(part)
    return obj


def load_program(spec: str):
    """A ``dspy.Module`` with at least one predictor from ``spec``: the object itself if it is a module instance,
    else the result of calling it with no arguments (a factory function or a class with defaults)."""
    obj = load_object(spec)
    if not isinstance(obj, dspy.Module):
        if not callable(obj):
            raise LoadError(f"{spec} is of type {type(obj).__name__}, not a dspy.Module or a zero-argument "
                            "factory of one")
        try:
            obj = obj()
        except TypeError as exc:
            raise LoadError(f"calling {spec}() failed ({exc}); point at a program instance or a zero-argument "
                            "function that builds one") from exc
        except Exception as exc:
            raise LoadError(f"calling {spec}() failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(obj, dspy.Module):
            raise LoadError(f"{spec}() returned an object of type {type(obj).__name__}, not a dspy.Module")
    try:
        roles(obj)
    except ValueError as exc:
        raise LoadError(f"{spec}: {exc}") from exc
    return obj
