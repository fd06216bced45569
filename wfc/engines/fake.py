"""A scripted engine for unit tests: answers from a list, a dict, or a function; records every call.

Not a model: token ids are the UTF-8 bytes of the text and log-probs are zeros. Every fake-tested path also has a
test on the tiny real model (see tests/).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable, Iterable, Mapping

from wfc.engines.base import Generation, GenerationRequest


def _encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


class ScriptedEngine:
    """Answers requests from a script.

    ``script`` is one of:
    - a list/iterable of strings, consumed in order (``StopIteration`` -> error naming the call);
    - a dict mapping a substring of the last message to the answer (first match wins);
    - a function ``(request) -> str`` (raise inside it to simulate an engine failure).
    """

    def __init__(self, script: Iterable[str] | Mapping[str, str] | Callable[[GenerationRequest], str]):
        self._lock = threading.Lock()
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
        prompt = "\n".join(m["content"] for m in request.messages)
        ids = _encode(text)
        return Generation(text=text, prompt_ids=_encode(prompt), completion_ids=ids, logprobs=[0.0] * len(ids))

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

    def sync_adapters(self, names) -> None:
        """No-op: a script has no weights."""
