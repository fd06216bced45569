"""The compact adapter's prompt: instructions in the system turn, the reply-only reminder closing the last user turn
(where a 135M model follows it), demos as bare user/assistant turns."""

import dspy
from pydantic import BaseModel

from wfc.adapter import CompactChatAdapter, reply_text


def test_the_reminder_closes_the_last_user_turn_and_demos_stay_bare():
    sig = dspy.Signature("question -> answer", "Solve it.")
    messages = CompactChatAdapter().format(sig, [dspy.Example(question="1 + 1?", answer="2")], {"question": "2 + 3?"})
    assert messages == [
        {"role": "system", "content": "Solve it.\nReply with only the answer."},
        {"role": "user", "content": "1 + 1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2 + 3?\nReply with only the answer."},
    ]
    assert CompactChatAdapter().parse(sig, " 5 ") == {"answer": "5"}


def test_several_inputs_are_named_lines_before_the_reminder():
    sig = dspy.Signature("question, candidates: list[str] -> answer: int", "Pick one.")
    messages = CompactChatAdapter().format(sig, [], {"question": "2 + 3?", "candidates": ["5", "6"]})
    assert messages[-1]["content"] == "Question: 2 + 3?\nCandidates: \n1. 5\n2. 6\nReply with only the answer."


def test_fine_tuning_data_replies_the_way_the_adapter_parses():
    """DSPy's BootstrapFinetune trains on ``format_finetune_data``: its assistant turn must be what ``parse`` reads
    (a compact reply is the bare value, as demos show it), else the model learns another format."""
    adapter = CompactChatAdapter()
    one = dspy.Signature("question -> answer: int")
    data = adapter.format_finetune_data(one, demos=[], inputs={"question": "3 + 4?"}, outputs={"answer": 7})
    reply = data["messages"][-1]
    assert reply == {"role": "assistant", "content": "7"} and adapter.parse(one, reply["content"]) == {"answer": 7}
    two = dspy.Signature("question -> reasoning, answer: int")
    data = adapter.format_finetune_data(two, demos=[], inputs={"question": "3 + 4?"},
                                        outputs={"reasoning": "add", "answer": 7})
    assert adapter.parse(two, data["messages"][-1]["content"]) == {"reasoning": "add", "answer": 7}


class City(BaseModel):
    name: str
    population: int


def test_structured_values_are_shown_and_taught_as_the_json_the_adapter_reads_back():
    """A pydantic, dict or list output in a demo or a fine-tuning target is written as JSON (what ``parse`` reads and
    what the field's grammar writes), never as Python's ``str`` of it (``name='Oslo' population=700000``)."""
    adapter = CompactChatAdapter()
    sig = dspy.Signature({"text": (str, dspy.InputField()), "city": (City, dspy.OutputField())}, "Read the city.")
    city = City(name="Oslo", population=700000)
    messages = adapter.format(sig, [dspy.Example(text="Oslo has 700000 people.", city=city)], {"text": "x"})
    assert messages[2] == {"role": "assistant", "content": '{"name":"Oslo","population":700000}'}
    reply = adapter.format_finetune_data(sig, [], {"text": "x"}, {"city": city})["messages"][-1]["content"]
    assert reply == messages[2]["content"] and adapter.parse(sig, reply) == {"city": city}
    listed = dspy.Signature("text -> names: list[str]", "List them.")
    assert adapter.parse(listed, reply_text(["a", "b c"])) == {"names": ["a", "b c"]}
    assert reply_text({"a": 1}) == '{"a":1}' and reply_text(12) == "12" and reply_text("twelve") == "twelve"
