"""One verdict reader (``wfc.verdict``) for the program, the credit and the adapter's yes/no fields."""

import pytest

from wfc.adapter import coerce
from wfc.verdict import read_verdict


@pytest.mark.parametrize("value, reading", [
    ("correct", True), ("Correct, well done", True), ("  **Yes**", True), ("Right, but check the carry", True),
    ("accepted.", True), (True, True),
    ("incorrect", False), ("not correct", False), ("No.", False), ("Wrong: 2+3 is 5", False), (False, False),
    # prose is not guessed at, and a word merely starting like a verdict word is not one
    ("The function is correct.", None), ("correctly handles the sign", None), ("yesterday's answer", None),
    ("notably fine", None), ("", None), (None, None), ("10", None),
])
def test_read_verdict_by_the_first_word(value, reading):
    assert read_verdict(value) is reading


@pytest.mark.parametrize("text, value", [("yes", True), ("Right.", True), ("not at all", False), ("0", False)])
def test_bool_fields_parse_with_the_same_reader(text, value):
    assert coerce(text, bool) is value


@pytest.mark.parametrize("text", ["", "The answer is yes", "maybe"])
def test_bool_field_that_does_not_read_is_a_parse_error_that_says_what_was_expected(text):
    with pytest.raises(ValueError, match="yes/no"):
        coerce(text, bool)
