"""Deriving role signatures from a task signature, so one topology serves math (question -> answer) and code
(prompt -> code) alike. Field names of the task are kept; derived roles add inputs, never rename the task's own."""

from __future__ import annotations

from typing import Any

import dspy


def task_signature(signature: Any) -> type[dspy.Signature]:
    sig = dspy.ensure_signature(signature)
    if not sig.input_fields or not sig.output_fields:
        raise ValueError(f"signature {sig.signature!r} needs at least one input and one output field")
    return sig


def primary_output(signature: type[dspy.Signature]) -> str:
    return next(iter(signature.output_fields))


def derive(signature: type[dspy.Signature], *, instructions: str, extra_inputs: dict[str, tuple[type, str]] = {},
           outputs_as_inputs: bool = False, prefix: str = "",
           outputs: dict[str, tuple[type, str]] | None = None) -> type[dspy.Signature]:
    """A new signature: the task's inputs, optionally its outputs as inputs (renamed ``prefix + name``), extra
    inputs, and either the task's outputs or ``outputs``."""
    fields: dict[str, tuple[Any, Any]] = {}
    for name, info in signature.input_fields.items():
        fields[name] = (info.annotation, dspy.InputField(desc=_desc(info)))
    if outputs_as_inputs:
        for name, info in signature.output_fields.items():
            fields[prefix + name] = (info.annotation, dspy.InputField(desc=_desc(info)))
    for name, (annotation, desc) in extra_inputs.items():
        fields[name] = (annotation, dspy.InputField(desc=desc))
    if outputs is None:
        for name, info in signature.output_fields.items():
            fields[name] = (info.annotation, dspy.OutputField(desc=_desc(info)))
    else:
        for name, (annotation, desc) in outputs.items():
            fields[name] = (annotation, dspy.OutputField(desc=desc))
    return dspy.Signature(fields, instructions)


def _desc(info) -> str:
    desc = (info.json_schema_extra or {}).get("desc", "")
    return "" if desc.startswith("${") else desc
