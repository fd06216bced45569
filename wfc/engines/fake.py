"""A scripted engine for unit tests: answers from a list, a dict, or a function; records every call.

Not a model. Without a tokenizer, token ids are the UTF-8 bytes of the text. With ``tokenizer=`` (a policy's),
they are real ids of that tokenizer, so a whole compile can train on scripted rollouts: ``prompt_ids`` are the chat
template with the generation prompt (what :class:`~wfc.engines.hf.HFEngine` conditions on), ``completion_ids`` the
text's ids plus EOS. Log-probs are zeros of the right length, marked ``logprobs_known=False`` (the trainer then
treats them as unknown: no importance correction, no mismatch). ``handoffs`` records every ``load_adapters`` call
as ``[(name, revision), ...]``. Every fake-tested path also has a test on the tiny real model (see tests/).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Mapping, Sequence

from wfc.engines.base import AdapterRevision, Generation, GenerationRequest


def _encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


class ScriptedEngine:
    """Answers requests from a script.

    ``script`` is one of:
    - a list/iterable of strings, consumed in order (``StopIteration`` -> error naming the call);
    - a dict mapping a substring of the last message to the answer (first match wins);
    - a function ``(request) -> str`` (raise inside it to simulate an engine failure).
    """

    handle = None  # no model behind a script (the engine protocol's attributes)
    policy = None
    context_length = None

    def __init__(self, script: Iterable[str] | Mapping[str, str] | Callable[[GenerationRequest], str], *,
                 tokenizer: Any = None):
        self._lock = threading.Lock()
        self.tokenizer = tokenizer
        self.handoffs: list[list[tuple[str, int]]] = []
        if callable(script):
            self._answer = script
        elif isinstance(script, Mapping):
            table = dict(script)

            def answer(request: GenerationRequest) -> str:
                last = request.messages[-1]["content"]
                for key, value in table.items():
                    if key in last:
                        return value
                raise LookupError(f"ScriptedEngine: no scripted answer matches the last message: {last[:200]!r}")

            self._answer = answer
        else:
            items = iter(list(script))

            def answer(request: GenerationRequest) -> str:
                try:
                    return next(items)
                except StopIteration:
                    raise LookupError("ScriptedEngine: the scripted answers ran out") from None

            self._answer = answer
        self.calls: list[GenerationRequest] = []
        self.generate_calls = 0

    def _one(self, request: GenerationRequest) -> Generation:
        with self._lock:
            self.calls.append(request)
            text = self._answer(request)
        if request.sampling.choices and text not in request.sampling.choices:
            raise LookupError(f"ScriptedEngine: scripted answer {text!r} is not one of the request's choices "
                              f"{list(request.sampling.choices)!r}: a choice request always gets one of them")
        if self.tokenizer is None:
            prompt_ids = _encode("\n".join(m["content"] for m in request.messages))
            ids = _encode(text)
        else:
            prompt_ids = self.encode_prompt(request.messages)
            ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
        return Generation(text=text, prompt_ids=prompt_ids, completion_ids=ids, logprobs=[0.0] * len(ids),
                          logprobs_known=False)

    def encode_prompt(self, messages) -> list[int]:
        """The prompt ids of ``messages`` under the tokenizer's chat template (needs ``tokenizer=``)."""
        if self.tokenizer is None:
            raise ValueError("ScriptedEngine has no tokenizer: build it with tokenizer=policy.tokenizer")
        text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def submit(self, request: GenerationRequest) -> Future:
        future: Future = Future()
        try:
            future.set_result(self._one(request))
        except Exception as exc:  # delivered to the caller, like a real engine's failure
            future.set_exception(exc)
        with self._lock:
            self.generate_calls += 1
        return future

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        return [self.submit(r).result() for r in requests]

    def close(self) -> None:
        pass

    def load_adapters(self, revisions: Sequence[AdapterRevision]) -> None:
        """Records ``[(name, revision), ...]`` in ``handoffs``: a script has no weights."""
        with self._lock:
            self.handoffs.append([(r.name, r.revision) for r in revisions])
