"""Command-line flags that the ``wfc`` CLI, the examples and the benchmarks share, each parsed in one place.

- ``--set KEY=VALUE`` (repeatable) overrides one config field. VALUE is read as JSON when it parses (``3``, ``true``,
  ``[1, 2]``, ``{"r": 8}``) and kept as the string otherwise (``credit=verified``); a dotted KEY names a field inside a
  section (``lora.r=8`` sets ``r`` of ``lora`` and keeps its other fields). :func:`parse_set` turns the flags into
  ``{KEY: VALUE}`` (what a run records as its overrides), :func:`apply_overrides` applies them to a config dict.
- ``--stop STR`` (repeatable, escapes such as ``\\n`` decoded) and ``--no-stop`` set every role's stop strings
  (:func:`add_stop_flags`, :func:`stop_from_args`).

Mistakes raise ``ValueError`` with a message naming the flag; a script turns it into its usage error
(``parser.error``), the CLI into its one-line ``wfc: error``.
"""

from __future__ import annotations

import argparse
import codecs
import json
from typing import Any, Iterable, Mapping


def parse_set(items: Iterable[str]) -> dict[str, Any]:
    """``--set`` flags as ``{KEY: VALUE}`` in the order given. A KEY given twice keeps its last VALUE, placed where
    that last flag stood, so applying the dict in order (:func:`apply_overrides`) equals applying the flags one by
    one. ``ValueError`` for an item without ``=`` or with an empty KEY."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ValueError(f"--set expects FIELD=VALUE (a JSON value, or a plain string), got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.pop(key, None)
        out[key] = value
    return out


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with each override set, in order; ``config`` and its sections are left as they were.

    A plain KEY replaces the field whole (``lora={"r": 8}`` drops the other ``lora`` fields); a dotted KEY sets one
    field of a section and creates the section when it is missing (``lora.r=8``). ``ValueError`` when a dotted KEY
    runs through a field that holds something other than a section."""
    out = dict(config)
    for key, value in overrides.items():
        *sections, leaf = key.split(".")
        target = out
        for depth, name in enumerate(sections):
            inner = target.get(name, {})
            if not isinstance(inner, Mapping):
                where = ".".join(sections[: depth + 1])
                raise ValueError(f"--set {key}: {where} holds {inner!r}, not a section of fields; set {where}=... "
                                 f"whole instead")
            target[name] = dict(inner)  # a copy, so the caller's section is never changed
            target = target[name]
        target[leaf] = value
    return out


def add_set_flag(parser: argparse.ArgumentParser, *, what: str = "config field") -> None:
    """``--set KEY=VALUE`` (repeatable) on ``parser``, collected as ``args.set`` (a list of strings)."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override one {what} (a JSON value; lora.r=8 sets one field of a section); repeatable")


def decode_stop(items: Iterable[str]) -> tuple[str, ...]:
    """Command-line stop strings with their escapes decoded (``'\\n'`` -> a newline)."""
    return tuple(codecs.decode(s, "unicode_escape") for s in items)


def add_stop_flags(parser: argparse.ArgumentParser) -> None:
    """``--stop STR`` (repeatable, escapes decoded; replaces the default stop strings) and ``--no-stop`` on
    ``parser``; read them back with :func:`stop_from_args`."""
    parser.add_argument("--stop", action="append", default=None, metavar="STR",
                        help="every role stops at STR (repeatable, escapes such as \\n decoded; replaces the "
                             "default stop strings)")
    parser.add_argument("--no-stop", action="store_true", help="no stop strings: every call runs to its token budget")


def stop_from_args(args: argparse.Namespace, default: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The stop strings :func:`add_stop_flags`' flags ask for: ``default`` when neither flag is given, none with
    ``--no-stop``. ``ValueError`` when both are given."""
    if args.no_stop and args.stop:
        raise ValueError("--stop and --no-stop contradict each other: pass one")
    return () if args.no_stop else tuple(default) if args.stop is None else decode_stop(args.stop)
