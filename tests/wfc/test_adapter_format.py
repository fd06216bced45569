"""The compact adapter's prompt: instructions in the system turn, the reply-only reminder closing the last user turn
(where a 135M model follows it), demos as bare user/assistant turns."""

import dspy

from wfc.adapter import CompactChatAdapter


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
