"""Structured decoding: a grammar per call, built from the role's signature and adapter, so every call parses.

Data model:
- A *grammar* is llguidance Lark text (a ``str``). It is what a ``GenerationRequest`` carries (``grammar``), what a
  ``CallNode`` records and what the trainer replays; equal text means equal constraint. ``None`` means unconstrained.
- :func:`signature_grammar` builds it from a DSPy signature and the adapter that formats and parses the call:
  - ``ChatAdapter`` (and the compact adapter's several-output fallback): each output field's ``[[ ## name ## ]]``
    marker in order, its value, then ``[[ ## completed ## ]]`` and EOS; the markers are forced tokens.
  - ``JSONAdapter``: one JSON object with every output field, each under its type's JSON schema.
  - ``CompactChatAdapter`` with one output: the bare value when its type constrains anything (``int``, ``float``,
    ``bool``, ``list``, ``dict``, pydantic models); ``str`` is left free and ``Literal`` outputs are scored as
    whole choices instead (``wfc.engines.base``).
- Values by type: ``str`` is free text with a token budget of its own, ended by a newline or, when the budget runs
  out, by the next marker, which is then forced (so a long ``reasoning`` cannot eat the answer); it cannot contain
  ``[[``, so no field marker is ever written by a value. ``int``/``float`` are decimal numbers; ``bool`` is
  ``true``/``false``; ``Literal[...]`` one of its values; everything else (``list``, ``dict``, pydantic models, a
  ReAct tool's arguments) JSON under pydantic's schema of the annotation.
- ReAct (``tools``): the ``next_tool_name`` / ``next_tool_args`` pair is one alternative per tool, so a tool's
  arguments are always validated against that tool's own schema.

Masks (:class:`GrammarMasks`): the allowed-token bitmask at each position of a completion, computed by replaying the
grammar over its tokens. The HF engine applies exactly these masks while sampling and the trainer recomputes them
with the same function, so both sides normalise log-probs over the same allowed set: log q(t) = log p(t) - log
sum_{allowed} p. A position whose mask admits one token is *forced*: q = 1, log q = 0, no gradient, no entropy, and
the trainer gives it no weight in the loss.
"""

from __future__ import annotations

import json
import threading
import typing
from typing import Any, Mapping

import dspy
import llguidance
import llguidance.hf
import llguidance.torch as llg_torch
import torch
from dspy.adapters.chat_adapter import ChatAdapter
from dspy.adapters.json_adapter import JSONAdapter
from dspy.adapters.xml_adapter import XMLAdapter
from pydantic import TypeAdapter

from wfc.adapter import CompactChatAdapter

DEFAULT_FIELD_TOKENS = 64  # a free-text field's token budget when the caller gives none
_MARKER_TOKENS = 10  # what one ``[[ ## name ## ]]`` marker costs in tokens, with its newlines (SmolLM2: 7-9)
_SHORT_VALUE_TOKENS = 8  # what a number, boolean or Literal value is allowed for in the budget arithmetic


# --------------------------------------------------------------------------------------------------------------
# Grammars from signatures


def _literal(text: str) -> str:
    return json.dumps(text)


def _is_literal(annotation) -> bool:
    return typing.get_origin(annotation) is typing.Literal


MAX_JSON_ITEMS = 8  # an array in a JSON value holds at most this many items (a budget for lists, like free text's)


def _cap(node: Any, chars: int) -> None:
    """Bound a JSON schema in place: strings to ``chars`` characters, arrays to ``MAX_JSON_ITEMS`` items, objects with
    declared properties to those. A token
    budget cannot end JSON early (cut mid-string it would not parse), so the schema itself carries the bound."""
    if isinstance(node, dict):
        if node.get("type") == "string":
            node.setdefault("maxLength", chars)
        if node.get("type") == "array":
            node.setdefault("maxItems", MAX_JSON_ITEMS)
        if node.get("type") in ("integer", "number"):  # at most 16 digits, as a typed ChatAdapter number
            node.setdefault("minimum", -(10**16 - 1))
            node.setdefault("maximum", 10**16 - 1)
        if node.get("type") == "object" and "properties" in node:
            node.setdefault("additionalProperties", False)  # a model's declared fields only: no unbounded extras
        for value in node.values():
            _cap(value, chars)
    elif isinstance(node, list):
        for value in node:
            _cap(value, chars)


def _copy(schema: Mapping[str, Any]) -> dict:
    """A deep copy of a JSON schema (a tool's ``args``): ``_cap`` writes into what it bounds, never into the tool."""
    return json.loads(json.dumps(dict(schema)))


def _json_schema(annotation, *, budget: int) -> dict:
    schema = TypeAdapter(annotation).json_schema()
    _cap(schema, 2 * budget)
    schema.setdefault("x-guidance", {"whitespace_flexible": False})  # compact JSON: no runs of spaces to loop on
    return schema


def value_rule(name: str, annotation, *, budget: int) -> tuple[str, bool]:
    """The Lark rule ``name`` for one value of ``annotation`` in ChatAdapter's format, and whether the value ends
    with the newline that closes it (free text does: its stop is that newline)."""
    if annotation is str or annotation is None or annotation is typing.Any:
        return f'{name}[stop="\\n", max_tokens={budget}]: /([^\\[\\n]|\\[[^\\[\\n])*/', True
    if annotation is bool:
        return f'{name}: "true" | "false"', False
    if annotation is int:
        return f"{name}: /-?(0|[1-9][0-9]{{0,15}})/", False
    if annotation is float:
        return f"{name}: /-?(0|[1-9][0-9]{{0,15}})(\\.[0-9]{{1,8}})?/", False
    if _is_literal(annotation):
        values = typing.get_args(annotation)
        return f"{name}: " + " | ".join(_literal(str(v)) for v in values), False
    return f"{name}: %json {json.dumps(_json_schema(annotation, budget=budget))}", False


def _marker(field: str) -> str:
    return f"[[ ## {field} ## ]]"


def _open_ended(annotation) -> bool:
    """Whether a value of ``annotation`` has a length the budget must bound (free text, JSON); numbers, booleans
    and ``Literal`` values are short by their grammar."""
    return not (annotation in (int, float, bool) or _is_literal(annotation))


def _budgets(fields: Mapping[str, Any], field_tokens: int | Mapping[str, int], max_tokens: int | None) -> dict:
    """Each output field's token budget: ``field_tokens`` (per field when a mapping), the open-ended fields' shrunk
    together so that markers, short values and every field fit in ``max_tokens`` (a call cut by ``max_tokens`` would
    not parse)."""
    default = field_tokens if isinstance(field_tokens, int) else DEFAULT_FIELD_TOKENS
    wanted = {f: (field_tokens.get(f, default) if isinstance(field_tokens, Mapping) else default) for f in fields}
    if max_tokens is None:
        return wanted
    open_ended = [f for f, a in fields.items() if _open_ended(a)]
    room = max_tokens - _MARKER_TOKENS * (len(fields) + 1) - _SHORT_VALUE_TOKENS * (len(fields) - len(open_ended)) - 2
    total = sum(wanted[f] for f in open_ended)
    if total <= room:
        return wanted
    scale = max(room, len(open_ended)) / total
    return {f: (max(1, int(b * scale)) if f in open_ended else b) for f, b in wanted.items()}


def with_budgets(signature, **budgets: int):
    """``signature`` with free-text token budgets on the named output fields (``reasoning=24``): what structured
    decoding gives each of them (module doc). The budget is stored in the field, so it travels with the program."""
    for name, tokens in budgets.items():
        if name not in signature.output_fields:
            raise ValueError(f"{name!r} is not an output field of the signature; its outputs are "
                             f"{list(signature.output_fields)}")
        if not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"a field's budget is a positive number of tokens, got {name}={tokens!r}")
        signature = signature.with_updated_fields(name, max_tokens=tokens)
    return signature


def field_budgets(signature, default: int) -> dict[str, int]:
    """Each output field's free-text budget: the one :func:`with_budgets` stored in the field, else ``default``."""
    return {name: int((info.json_schema_extra or {}).get("max_tokens", default))
            for name, info in signature.output_fields.items()}


def chat_grammar(fields: Mapping[str, Any], *, field_tokens: int | Mapping[str, int] = DEFAULT_FIELD_TOKENS,
                 max_tokens: int | None = None, tools: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """ChatAdapter's sections for ``fields`` (name -> annotation, in order). ``tools`` (ReAct: tool name -> JSON
    schema of its ``args``) makes ``next_tool_name`` and ``next_tool_args`` one alternative per tool."""
    budgets = _budgets(fields, field_tokens, max_tokens)
    names = list(fields)
    react = tools is not None and "next_tool_name" in fields and "next_tool_args" in fields
    rules, parts = [], []
    newline_done = False
    for i, field in enumerate(names):
        sep = _literal(("" if i == 0 else ("\n" if newline_done else "\n\n")) + _marker(field) + "\n")
        if react and field == "next_tool_name":
            alts = []
            for k, (tool, args) in enumerate(tools.items()):
                schema = {"type": "object", "properties": _copy(args), "required": list(args),
                          "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}
                _cap(schema, 2 * budgets["next_tool_args"])
                rules.append(f"tool_args_{k}: %json {json.dumps(schema)}")
                alts.append(f"{_literal(tool)} {_literal(chr(10) * 2 + _marker('next_tool_args') + chr(10))} "
                            f"tool_args_{k}")
            rules.append("tool_call: " + " | ".join(f"({a})" for a in alts))
            parts.append(f"{sep} tool_call")
            newline_done = False
            continue
        if react and field == "next_tool_args":
            continue
        rule, newline_done = value_rule(f"field_{i}", fields[field], budget=budgets[field])
        rules.append(rule)
        parts.append(f"{sep} field_{i}")
    end = ("\n" if newline_done else "\n\n") + _marker("completed")
    return "\n".join([f"start: {' '.join(parts)} {_literal(end)}", *rules])


def json_grammar(fields: Mapping[str, Any], *, field_tokens: int | Mapping[str, int] = DEFAULT_FIELD_TOKENS,
                 max_tokens: int | None = None, tools: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """JSONAdapter's one object with every field of ``fields``, strings capped at 2 characters per budgeted token.
    ``tools`` (ReAct): the object is one of a variant per tool, its name and arguments under that tool's schema."""
    budgets = _budgets(fields, field_tokens, max_tokens)
    props = {}
    for field, annotation in fields.items():
        schema = _json_schema(annotation, budget=budgets[field])
        schema.pop("x-guidance", None)
        props[field] = schema
    schema: dict[str, Any] = {"type": "object", "properties": props, "required": list(fields),
                              "additionalProperties": False}
    if tools is not None and "next_tool_name" in fields and "next_tool_args" in fields:
        variants = []
        for tool, args in tools.items():
            call = {"type": "object", "properties": _copy(args), "required": list(args), "additionalProperties": False}
            _cap(call, 2 * budgets["next_tool_args"])
            variants.append({**schema, "properties": {**props, "next_tool_name": {"const": tool},
                                                      "next_tool_args": call}})
        schema = {"anyOf": variants}
    schema["x-guidance"] = {"whitespace_flexible": False}
    return f"start: %json {json.dumps(schema)}"


def single_value_grammar(annotation, *, budget: int) -> str | None:
    """The compact adapter's bare single value, or None where there is nothing to constrain (``str``) or the value
    is scored as a whole choice (``Literal``)."""
    if annotation is str or annotation is None or _is_literal(annotation):
        return None
    rule, _ = value_rule("value", annotation, budget=budget)
    return f"start: value\n{rule}"


def signature_grammar(signature, adapter, *, field_tokens: int | Mapping[str, int] = DEFAULT_FIELD_TOKENS,
                      max_tokens: int | None = None,
                      tools: Mapping[str, Mapping[str, Any]] | None = None) -> str | None:
    """The grammar of one call of ``signature`` formatted by ``adapter`` (module doc), or None: unconstrained."""
    fields = {name: f.annotation for name, f in signature.output_fields.items()}
    if isinstance(adapter, JSONAdapter):
        return json_grammar(fields, field_tokens=field_tokens, max_tokens=max_tokens, tools=tools)
    if isinstance(adapter, CompactChatAdapter) and len(fields) == 1:
        (annotation,) = fields.values()
        budget = _budgets(fields, field_tokens, max_tokens)[next(iter(fields))]
        return single_value_grammar(annotation, budget=budget)
    if isinstance(adapter, ChatAdapter) and not isinstance(adapter, XMLAdapter):
        return chat_grammar(fields, field_tokens=field_tokens, max_tokens=max_tokens, tools=tools)
    return None  # an adapter with a format of its own (XML, two-step): decoded unconstrained


def response_format_grammar(response_format: Mapping[str, Any] | None) -> str | None:
    """The grammar of OpenAI's chat ``response_format``: ``json_schema`` (its ``schema``), ``json_object`` (any
    object) or ``text`` / None (unconstrained). Raises ValueError, saying what to send, for anything else."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        schema: dict[str, Any] = {"type": "object"}
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
            raise ValueError("response_format json_schema needs {'type': 'json_schema', 'json_schema': {'name': ..., "
                             "'schema': {...}}}")
        schema = json.loads(json.dumps(spec["schema"]))  # a copy: _cap writes into it
    else:
        raise ValueError(f"response_format type {kind!r} is not supported: send 'json_schema', 'json_object' or "
                         "'text'")
    _cap(schema, 4 * DEFAULT_FIELD_TOKENS)
    schema.setdefault("x-guidance", {"whitespace_flexible": False})
    return f"start: %json {json.dumps(schema)}"


def react_tools(owner) -> dict[str, dict[str, Any]] | None:
    """Tool name -> JSON schema of its arguments for a ``dspy.ReAct`` module (its ``finish`` tool included), else
    None."""
    if not isinstance(owner, dspy.ReAct):
        return None
    return {name: dict(tool.args or {}) for name, tool in owner.tools.items()}


# --------------------------------------------------------------------------------------------------------------
# Masks


class GrammarMasks:
    """Allowed-token bitmasks of grammars over one tokenizer (llguidance). Thread-safe; the llguidance tokenizer is
    built once per instance (about 0.3 s for SmolLM2)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer)
        self.vocab_size = self.ll_tokenizer.vocab_size
        self.eos = tokenizer.eos_token_id
        self._lock = threading.Lock()
        self._checked: dict[str, str] = {}

    def matcher(self, grammar: str):
        """A fresh matcher at the start of ``grammar``; raises ValueError for a grammar llguidance rejects."""
        with self._lock:
            error = self._checked.get(grammar)
            if error is None:
                error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar),
                                                             self.ll_tokenizer)
                self._checked[grammar] = error
        if error:
            raise ValueError(f"the decoding grammar does not compile ({error[:300]}): {grammar[:200]!r}")
        return llguidance.LLMatcher(self.ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)

    def new_bitmask(self, rows: int) -> torch.Tensor:
        return llg_torch.allocate_token_bitmask(rows, self.vocab_size)

    def fill(self, matcher, bitmask: torch.Tensor, row: int) -> None:
        llg_torch.fill_next_token_bitmask(matcher, bitmask, row)


    def replay(self, grammar: str, completion_ids: list[int]) -> torch.Tensor:
        """The bitmask (R, W) int32 in force at each of ``completion_ids``' positions; raises ValueError when the
        completion leaves the grammar (it was not decoded under it)."""
        matcher = self.matcher(grammar)
        out = self.new_bitmask(len(completion_ids))
        for i, token in enumerate(completion_ids):
            self.fill(matcher, out, i)
            if matcher.is_stopped():
                continue  # EOS after the end of the grammar: its mask is what fill gave (EOS only)
            if not matcher.consume_token(token):
                raise ValueError(f"token {token} at position {i} is outside the grammar: {matcher.get_error()[:200]}")
        return out


def additive_mask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """(N, W) int32 bitmask -> (N, vocab) float32: 0 where a token is allowed, -inf where not (vocab entries past
    the bitmask are not allowed). Added to logits it masks them; llguidance's own kernel does the unpacking."""
    out = torch.zeros(bitmask.shape[0], vocab, dtype=torch.float32)
    llg_torch.apply_token_bitmask_inplace(out, bitmask.cpu())
    return out


def unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """(N, W) int32 bitmask -> (N, vocab) bool allowed-token mask."""
    return additive_mask(bitmask, vocab) == 0


def forced(bitmask: torch.Tensor) -> torch.Tensor:
    """(N,) bool: positions whose mask admits exactly one token."""
    counts = torch.zeros(bitmask.shape[0], dtype=torch.int64)
    words = bitmask.to(torch.int64) & 0xFFFFFFFF
    for shift in range(32):
        counts += ((words >> shift) & 1).sum(-1)
    return counts == 1
