"""Retrieved demonstrations (wfc.retrieve): the TF-IDF ranking against hand-worked tables, selection per run on the
run's own copy, never a run's own example, and the JSON round trip the artifact uses."""

import math

import dspy
import pytest

from programs import Single
from wfc.lower import trace
from wfc.retrieve import DemoRetriever, dump, install, load_into, rank, retrievers, select_demos, tokens

SIG = dspy.Signature("question -> answer", "Answer the question.")


def test_tokens_are_lowercased_words_and_digit_runs():
    assert tokens("Clamp(X) to [-3, 12].") == ["clamp", "x", "to", "3", "12"]


def test_rank_by_hand():
    # N = 3 documents; idf(t) = ln(4 / (1 + df)) + 1: df 1 -> 1.693147, df 2 -> 1.287682.
    docs = ["add two numbers", "add three numbers", "reverse a string"]
    # query "add two": q = (add 1.287682, two 1.693147), |q| = 2.127175; d0 shares both terms: cos 0.855;
    # d1 shares "add": 1.658125 / (2.127175 * 2.486563) = 0.313; d2 shares nothing: 0
    assert rank("add two", docs, 3) == [0, 1, 2]
    assert rank("add two", docs, 1) == [0]
    # a document equal to the query is never returned (a training example is not its own demo)
    assert rank("add two numbers", docs, 3) == [1, 2]
    assert rank("add two", docs, 0) == []


def test_rank_weighs_rare_terms_above_common_ones_by_hand():
    # "common" is in 2 of 3 documents (idf 1.287682), "rare" in 1 (1.693147). Query "rare common":
    # d2 = (rare, foo): 1.693147^2 / (2.127175 * 1.693147 * sqrt(2)) = 0.5628
    # d0 = (common, bar): 1.287682^2 / (2.127175 * 2.127175) = 0.3665, and d1 ties with d0 (the lower index first).
    # Raw counts would tie d2 with d0 (cosine 0.5 each) and put d0 first.
    docs = ["common bar", "common baz", "rare foo"]
    assert rank("rare common", docs, 3) == [2, 0, 1]
    q = math.sqrt((math.log(4 / 2) + 1) ** 2 + (math.log(4 / 3) + 1) ** 2)
    assert round(q, 6) == 2.127175  # the norm the comments above use


def test_rank_with_no_shared_term_keeps_document_order():
    assert rank("zebra", ["a b", "c d", "e"], 2) == [0, 1]


def _retriever(k=1):
    pool = [{"question": f"What is {a} plus {b}?", "answer": str(a + b)} for a, b in ((1, 2), (7, 8), (30, 40))]
    return DemoRetriever(k=k, query=["question"], pool=pool)


def test_select_picks_the_nearest_and_never_the_run_itself():
    r = _retriever(k=1)
    assert [d.answer for d in r.select({"question": "What is 7 plus 9?"})] == ["15"]
    assert [d.answer for d in r.select({"question": "What is 7 plus 8?"})] == ["3"]  # itself left out
    demo = r.select({"question": "What is 30 plus 5?"})[0]
    assert dict(demo.inputs()) == {"question": "What is 30 plus 40?"}


def test_select_unlike_passes_over_answers_already_shown():
    # "What is 7 plus 9?": "7" is rare, so "7 plus 8" (15) is nearest; "1 plus 2" (3), "30 plus 40" (70) and
    # "5 plus 10" (15) share only the words every entry has, so they tie and the earlier comes first
    pool = [{"question": f"What is {a} plus {b}?", "answer": str(a + b)} for a, b in ((1, 2), (7, 8), (30, 40), (5, 10))]
    r = DemoRetriever(k=1, query=["question"], pool=pool)
    q = {"question": "What is 7 plus 9?"}
    shown = r.select(q)
    assert [d.answer for d in shown] == ["15"]
    assert [d.answer for d in r.select(q, unlike=shown)] == ["3"]
    shown += r.select(q, unlike=shown)
    # "30 plus 40" and "5 plus 10" tie; "5 plus 10" would show the answer 15 again, so it is never picked
    assert [d.answer for d in r.select(q, unlike=shown)] == ["70"]
    shown += r.select(q, unlike=shown)
    assert r.select(q, unlike=shown) == []  # the pool has no other answer left
    two = DemoRetriever(k=2, query=["question"], pool=pool)
    assert [d.answer for d in two.select(q, unlike=two.select(q))] == ["70"]  # fewer once the pool runs out
    # one selection shows each answer once: with "5 plus 10" ahead of "30 plus 40" in the pool, the two nearest
    # answers other than "3" would be 15 twice
    reordered = DemoRetriever(k=2, query=["question"], pool=[pool[0], pool[1], pool[3], pool[2]])
    assert [d.answer for d in reordered.select(q, unlike=[r.select(q, unlike=shown[:1])[0]])] == ["15", "70"]


def test_select_demos_adds_to_a_copy_after_the_static_demos():
    program = Single(SIG)
    static = dspy.Example(question="q", answer="a").with_inputs("question")
    program.solver.demos = [static]
    install(program, {"solver": _retriever(k=2)})
    copy = program.deepcopy()
    select_demos(copy, {"question": "What is 7 plus 9?"})
    assert [d.get("answer") for d in copy.solver.demos] == ["a", "15", "3"]
    assert program.solver.demos == [static]  # the held program never changes
    other = program.deepcopy()
    select_demos(other, {"other_field": "x"})  # inputs without the query fields: not this retriever's task
    assert other.solver.demos == [static]


def test_install_refuses_unknown_roles():
    with pytest.raises(ValueError, match="program's roles are \\['solver'\\]"):
        install(Single(SIG), {"voter": _retriever()})


def test_dump_and_load_round_trip():
    program = Single(SIG)
    assert dump(program) is None
    install(program, {"solver": _retriever(k=2)})
    data = dump(program)
    fresh = Single(SIG)
    load_into(fresh, data)
    assert retrievers(fresh) == retrievers(program)
    with pytest.raises(ValueError):
        load_into(Single(SIG), {"solver": {"k": 0, "query": ["question"], "pool": []}})


def test_trace_shows_each_run_its_own_retrieved_demo(fake_engine):
    program = Single(SIG)
    install(program, {"solver": _retriever(k=1)})
    engine = fake_engine(lambda request: "0")
    for question, shown, hidden in (("What is 7 plus 9?", "15", "What is 1 plus 2?"),
                                    ("What is 1 plus 3?", "What is 1 plus 2?", "What is 30 plus 40?")):
        graph = trace(program, dspy.Example(question=question).with_inputs("question"), engine)
        text = "\n".join(m["content"] for m in graph.calls[0].messages)
        assert shown in text and hidden not in text
    assert program.solver.demos == []
