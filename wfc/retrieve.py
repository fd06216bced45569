"""Retrieved demonstrations: each run of a role is shown the training examples nearest to its task.

A role's static ``predictor.demos`` are the same for every input; a :class:`DemoRetriever` on a role instead picks,
per run, the ``k`` examples of its pool whose query text is nearest (TF-IDF cosine, :func:`rank`) to the run's
inputs, and the run's copy of the program shows them after the role's static demos. ``compile`` builds the pools from
the trainset's gold labels (``compilers.prompts.retrieval_pools``); the artifact keeps them in
``program/retrieval.json`` (:func:`dump` / :func:`install`), so a loaded or served program retrieves as training did.

Invariants: selection happens once per run, on the run's own copy of the program (``wfc.lower.trace`` and
``CompiledProgram.forward`` copy before they select), so the program a user holds never changes and parallel runs
never see each other's demos; the query is built from the *program's* inputs (the task), so a role called several
times in a run sees the same demos (unless its program asks again with other ones on purpose:
``programs.Retry(vary_demos=True)``); a pool entry whose query text equals the run's is never shown (a training
example is not its own demo, so no run is handed its gold answer); the same inputs and pool give the same demos
(ties go to the earlier pool entry).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Mapping, Sequence

import dspy
from pydantic import BaseModel, ConfigDict, Field

_TOKEN = re.compile(r"[a-z_]+|\d+")
FILE = "retrieval.json"  # under the artifact's program/


def tokens(text: str) -> list[str]:
    """Lower-cased words and digit runs of ``text`` (punctuation and signs dropped)."""
    return _TOKEN.findall(text.lower())


def rank(query: str, documents: Sequence[str], k: int) -> list[int]:
    """Indices of the ``k`` documents nearest to ``query`` by TF-IDF cosine, best first; documents equal to the
    query are left out, ties go to the lower index. Weights: raw term count x (ln((1 + N) / (1 + df)) + 1), the
    smoothed IDF over the ``N`` documents (a term in every document still weighs 1, so it counts but little). A
    query sharing no term with any document still gets ``k`` (all at cosine 0, in document order)."""
    if k <= 0:
        return []
    docs = [Counter(tokens(d)) for d in documents]
    df = Counter(term for d in docs for term in d)
    n = len(docs)

    def weights(counts: Counter) -> dict[str, float]:
        return {t: c * (math.log((1 + n) / (1 + df.get(t, 0))) + 1) for t, c in counts.items()}

    q = weights(Counter(tokens(query)))
    q_norm = math.sqrt(sum(v * v for v in q.values()))
    scored = []
    for i, (text, d) in enumerate(zip(documents, docs)):
        if text == query:
            continue
        w = weights(d)
        norm = q_norm * math.sqrt(sum(v * v for v in w.values()))
        scored.append((-(sum(q[t] * w[t] for t in q if t in w) / norm if norm else 0.0), i))
    return [i for _, i in sorted(scored)[:k]]


class DemoRetriever(BaseModel):
    """One role's retrieval: ``k`` demos per run from ``pool`` (dicts of the role's input and output fields),
    matched on the ``query`` fields: the role's inputs, which are also inputs of the program (a labeled role answers
    the task from its own inputs)."""

    model_config = ConfigDict(frozen=True)

    k: int = Field(ge=1)
    query: list[str] = Field(min_length=1, description="the role's input fields, read off the program's inputs")
    pool: list[dict[str, Any]]

    def applies(self, inputs: Mapping[str, Any]) -> bool:
        """Whether ``inputs`` are this retriever's task (they hold every query field); a compiled program nested in
        another, called from inside the outer one's run, gets no retrieved demos rather than arbitrary ones."""
        return all(f in inputs for f in self.query)

    def text(self, values: Mapping[str, Any]) -> str:
        return "\n".join(str(values.get(f, "")) for f in self.query)

    def select(self, inputs: Mapping[str, Any], *, unlike: Sequence[dspy.Example] = ()) -> list[dspy.Example]:
        """The demos for a run on the program inputs ``inputs`` (module doc: nearest first, never its own).
        ``unlike``: demos already shown; the ``k`` nearest entries whose answers (every field beyond the query)
        differ from each of theirs and from each other are given instead (fewer, or none, once the pool runs out): what a program that
        asks again with other examples shows (``programs.Retry(vary_demos=True)``); an entry with a shown demo's
        answer would show the same solution again."""
        if not unlike:
            picked = rank(self.text(inputs), [self.text(d) for d in self.pool], self.k)
        else:  # in rank order, each answer once, none of the shown ones
            seen, picked = {self._answer(dict(d.items())) for d in unlike}, []
            for i in rank(self.text(inputs), [self.text(d) for d in self.pool], len(self.pool)):
                if len(picked) == self.k:
                    break
                if self._answer(self.pool[i]) not in seen:
                    seen.add(self._answer(self.pool[i]))
                    picked.append(i)
        return [dspy.Example(**self.pool[i]).with_inputs(*self.query) for i in picked]

    def _answer(self, entry: Mapping[str, Any]) -> tuple:
        return tuple(sorted((f, str(v)) for f, v in entry.items() if f not in self.query))


def retrievers(program: dspy.Module) -> dict[str, DemoRetriever]:
    """Role path -> the retriever installed on that role (roles without one are absent)."""
    return {path: p.wfc_retriever for path, p in program.named_predictors()
            if isinstance(getattr(p, "wfc_retriever", None), DemoRetriever)}


def install(program: dspy.Module, found: Mapping[str, DemoRetriever]) -> None:
    """Put each retriever on its role (in place); unknown roles are an error naming the program's roles."""
    by_path = dict(program.named_predictors())
    unknown = sorted(set(found) - set(by_path))
    if unknown:
        raise ValueError(f"retrievers for unknown roles {unknown}; the program's roles are {sorted(by_path)}")
    for path, retriever in found.items():
        by_path[path].wfc_retriever = retriever


def select_demos(program: dspy.Module, inputs: Mapping[str, Any]) -> None:
    """For a run's own copy of a program: each role with a retriever shows its static demos, then the retrieved
    ones for ``inputs``. Call it once per copy (a second call would add a second set)."""
    for _, p in program.named_predictors():
        retriever = getattr(p, "wfc_retriever", None)
        if isinstance(retriever, DemoRetriever) and retriever.applies(inputs):
            p.demos = list(p.demos) + retriever.select(inputs)


def dump(program: dspy.Module) -> dict[str, Any] | None:
    """The JSON form of the program's retrievers (``program/retrieval.json``), None when it has none."""
    found = retrievers(program)
    return {path: r.model_dump() for path, r in sorted(found.items())} or None


def load_into(program: dspy.Module, data: Mapping[str, Any]) -> None:
    """Install the retrievers of a :func:`dump` (raises ``ValueError`` on unknown roles or malformed entries)."""
    install(program, {path: DemoRetriever.model_validate(entry) for path, entry in data.items()})
