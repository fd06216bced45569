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
