"""Shared fixtures: the tiny real model (loaded once per session) and scripted fake engines.

- ``tiny_handle``: ``load_model("tiny")``, a deterministic random 2-layer Llama with SmolLM2's tokenizer. Shared:
  tests must not add adapters to it (build your own ``HFEngine(load_model("tiny"))`` for that).
- ``tiny_engine``: an ``HFEngine`` on ``tiny_handle``, closed at the end of the session. Its ``stats`` accumulate
  across tests: compare before/after, or build a dedicated engine when exact counts matter.
- ``fake_engine``: a factory of ``ScriptedEngine``s; ``fake_engine(by_system={...})`` answers by the first key found
  in the request's system message (put specific instructions before generic ones), so each role can be scripted.
"""

from __future__ import annotations

from typing import Callable, Mapping

import pytest

from wfc.engines.base import GenerationRequest
from wfc.engines.fake import ScriptedEngine

Answer = str | Callable[[GenerationRequest], str]


@pytest.fixture(scope="session")
def tiny_handle():
    from wfc.models import load_model

    return load_model("tiny")


@pytest.fixture(scope="session")
def tiny_engine(tiny_handle):
    from wfc.engines.hf import HFEngine

    engine = HFEngine(tiny_handle, batch_wait_s=0.1)  # a little slack so concurrent calls batch on a busy CI box
    yield engine
    engine.close()


def _system(request: GenerationRequest) -> str:
    return "\n".join(m["content"] for m in request.messages if m["role"] == "system")


@pytest.fixture
def fake_engine():
    """``fake_engine(script)`` -> ``ScriptedEngine(script)``; ``fake_engine(by_system={substring: answer})`` answers
    each request with the answer (a string, or a function of the request) of the first substring found in its
    system message, and fails loudly (a crash in the graph) when none matches."""
    made: list[ScriptedEngine] = []

    def make(script=None, *, by_system: Mapping[str, Answer] | None = None) -> ScriptedEngine:
        if (script is None) == (by_system is None):
            raise ValueError("fake_engine: pass exactly one of script or by_system")
        if by_system is not None:
            table = dict(by_system)

            def script(request: GenerationRequest) -> str:
                system = _system(request)
                for key, answer in table.items():
                    if key in system:
                        return answer(request) if callable(answer) else answer
                raise LookupError(f"fake_engine: no scripted role matches system message {system[:120]!r}")

        engine = ScriptedEngine(script)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()
