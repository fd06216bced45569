"""A DSPy chat adapter that small models can follow: compact prompts for single-output roles.

DSPy's ChatAdapter asks for ``[[ ## field ## ]]`` sections. Measured here, SmolLM2-135M never produces them (0 of 9
samples at T=1), so every call would be a format error and GRPO would see no signal at all. For a role with exactly
one output field there is nothing to delimit, so this adapter:

- formats: a system message with the signature's instructions and the output field's description, then the inputs
  as ``Name: value`` lines (a single input is sent as its bare value), ending with the same "Reply with only ..."
  line: a 135M model weighs the system turn little, and the reminder right before its turn is what it follows
  (measured on the demo task: base pass rate at T=0.7 and greedy accuracy, 12 new tokens, both up or equal);
- parses: the whole completion is the output field's value, coerced to its annotation (``list[str]`` also accepts one
  item per line; ``bool`` accepts yes/no/true/false/correct). A value that cannot be coerced is a format error.
- constrains: a single output annotated ``Literal["a", "b", ...]`` (strings) is decoded as one of its values
  (:meth:`CompactChatAdapter.choices`, which the rollout engine passes on as ``SamplingParams.choices``), and the
  reply line names them. A 135M model asked for a one-word verdict answers in prose (0 of 32 greedy EvalOpt verdicts
  readable on the code task); choosing among the values makes every call readable, so credit can score it.

Roles with several output fields (e.g. ``ChainOfThought``'s reasoning + answer) fall back to ChatAdapter's sections,
strictly (no JSON retry: a retry would be a second, hidden LM call in the rollout graph).
"""

from __future__ import annotations

import json
import re
import typing
from typing import Any

from dspy.adapters.chat_adapter import ChatAdapter
from dspy.adapters.utils import parse_value
from dspy.utils.exceptions import AdapterParseError
from pydantic import BaseModel

from wfc.verdict import read_verdict

_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)]|\(\d+\))\s*")


def _as_list(text: str) -> list[str]:
    try:
        value = json.loads(text)
        if isinstance(value, list):
            return [str(v) for v in value]
    except (ValueError, TypeError):
        pass
    items = [_BULLET.sub("", line).strip() for line in text.splitlines()]
    return [i for i in items if i]


def _as_bool(text: str) -> bool:
    verdict = read_verdict(text)
    if verdict is None:
        raise ValueError(f"expected yes/no, got {text[:40]!r}" if text.strip() else
                         "empty answer where yes/no was expected")
    return verdict


def reply_text(value: Any) -> str:
    """A single output's value written as this adapter reads it back (:func:`coerce`) and as a JSON-typed field's
    grammar writes it (``wfc.constrain``: compact JSON, no space after ``,`` or ``:``): JSON for pydantic models,
    dicts, lists and tuples; ``str`` otherwise. A demo or a fine-tuning target written with ``str`` would show a model
    as ``name='Ann' age=30``, which no completion of it may be."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str, separators=(",", ":"))
    return str(value)


def coerce(text: str, annotation: Any) -> Any:
    """The value of a single-output completion under ``annotation``; raises ValueError when it does not fit."""
    text = text.strip()
    if annotation is str or annotation is None:
        return text
    if annotation is bool:
        return _as_bool(text)
    origin = typing.get_origin(annotation)
    if origin is list and typing.get_args(annotation) in ((str,), ()):
        return _as_list(text)
    return parse_value(text, annotation)


class CompactChatAdapter(ChatAdapter):
    """ChatAdapter with compact single-output prompts (see module docstring)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("use_json_adapter_fallback", False)
        super().__init__(**kwargs)

    @classmethod
    def choices(cls, signature) -> tuple[str, ...]:
        """The values a completion must be one of: a single output annotated ``Literal`` of strings; else ()."""
        field = cls._single_output(signature)
        if field is None:
            return ()
        annotation = signature.output_fields[field].annotation
        values = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else ()
        return tuple(values) if values and all(isinstance(v, str) for v in values) else ()

    @staticmethod
    def _single_output(signature) -> str | None:
        outputs = list(signature.output_fields)
        return outputs[0] if len(outputs) == 1 else None

    def _user_content(self, signature, values: dict[str, Any]) -> str:
        names = list(signature.input_fields)
        if len(names) == 1:
            return self._render(values.get(names[0], ""))
        lines = []
        for name in names:
            if name in values:
                title = name.replace("_", " ").capitalize()
                lines.append(f"{title}: {self._render(values[name])}")
        return "\n".join(lines)

    @staticmethod
    def _render(value: Any) -> str:
        if isinstance(value, (list, tuple)):
            return "\n" + "\n".join(f"{i + 1}. {v}" for i, v in enumerate(value))
        return str(value)

    def format(self, signature, demos, inputs):
        field = self._single_output(signature)
        if field is None:
            return super().format(signature, demos, inputs)
        info = signature.output_fields[field]
        desc = (info.json_schema_extra or {}).get("desc") or field
        hint = desc if desc and not desc.startswith("${") else field.replace("_", " ")
        article = "" if hint.lower().startswith(("the ", "a ", "an ")) else "the "
        options = self.choices(signature)
        named = (": " + ", ".join(options[:-1]) + " or " + options[-1]) if options else ""
        reply = f"Reply with only {article}{hint}{named}."
        messages = [{"role": "system", "content": f"{signature.instructions.strip()}\n{reply}"}]
        for demo in demos or []:
            if field in demo:
                messages.append({"role": "user", "content": self._user_content(signature, demo)})
                messages.append({"role": "assistant", "content": reply_text(demo[field])})
        # The demos' user turns stay bare: the reminder closes the conversation once, right before the answer.
        messages.append({"role": "user", "content": f"{self._user_content(signature, inputs)}\n{reply}"})
        return messages

    def format_assistant_message_content(self, signature, outputs, missing_field_message=None) -> str:
        """The reply as this adapter parses it: the bare value for one output (as demos are shown), ChatAdapter's
        sections otherwise. DSPy builds fine-tuning data (``BootstrapFinetune``) and reflective examples with it."""
        field = self._single_output(signature)
        if field is None:
            return super().format_assistant_message_content(signature, outputs, missing_field_message)
        return reply_text(outputs[field]) if field in outputs else (missing_field_message or "")

    def parse(self, signature, completion: str) -> dict[str, Any]:
        field = self._single_output(signature)
        if field is None:
            return super().parse(signature, completion)
        annotation = signature.output_fields[field].annotation
        try:
            return {field: coerce(completion, annotation)}
        except (ValueError, TypeError) as exc:
            raise AdapterParseError(
                adapter_name="CompactChatAdapter",
                signature=signature,
                lm_response=completion,
                message=f"could not read field {field!r} as {annotation}: {exc}",
            ) from None
