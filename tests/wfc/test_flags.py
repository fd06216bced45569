"""wfc.flags: the one parser of ``--set KEY=VALUE`` (values as JSON or strings, dotted keys into sections, later
flags winning as if applied one by one) and of ``--stop`` / ``--no-stop``."""

from __future__ import annotations

import argparse

import pytest

from wfc.flags import add_set_flag, add_stop_flags, apply_overrides, decode_stop, parse_set, stop_from_args


def test_values_are_json_when_they_parse_and_strings_otherwise():
    assert parse_set(["steps=3", "credit=verified", "pass_band=[0, 1]", "dynamic_sampling=false", "lr=6e-4",
                      "stop=\\n", "empty="]) == {
        "steps": 3, "credit": "verified", "pass_band": [0, 1], "dynamic_sampling": False, "lr": 6e-4,
        "stop": "\\n", "empty": ""}
    assert parse_set(['lora={"r": 8}', "note=a=b"]) == {"lora": {"r": 8}, "note": "a=b"}  # the first = splits
    assert parse_set([]) == {}


@pytest.mark.parametrize("bad", ["steps", "=3", "lora..r=1", ".r=1"])
def test_an_item_without_a_field_is_refused_naming_the_form(bad):
    with pytest.raises(ValueError, match="--set expects FIELD=VALUE"):
        parse_set([bad])


def test_a_key_given_twice_keeps_its_last_value_in_its_last_place():
    assert list(parse_set(["a=1", "b=2", "a=3"]).items()) == [("b", 2), ("a", 3)]


def test_dotted_keys_set_one_field_of_a_section_and_leave_the_input_alone():
    recipe = {"steps": 10, "lora": {"r": 16, "alpha": 32}}
    out = apply_overrides(recipe, parse_set(["lora.r=8", "steps=2", "guards.clip=1.0"]))
    assert out == {"steps": 2, "lora": {"r": 8, "alpha": 32}, "guards": {"clip": 1.0}}
    assert recipe == {"steps": 10, "lora": {"r": 16, "alpha": 32}}  # neither the dict nor its section changed
    # a plain key replaces the section whole
    assert apply_overrides(recipe, {"lora": {"r": 4}}) == {"steps": 10, "lora": {"r": 4}}


def test_applying_in_order_equals_applying_each_flag_in_turn():
    # the whole section, then one field of it, then the whole section again: the last write of each path wins
    flags = ['lora={"alpha": 1}', "lora.r=8", 'lora={"r": 4}', "lora.alpha=2"]
    step_by_step: dict = {}
    for flag in flags:
        step_by_step = apply_overrides(step_by_step, parse_set([flag]))
    assert apply_overrides({}, parse_set(flags)) == step_by_step == {"lora": {"r": 4, "alpha": 2}}


def test_a_dotted_key_through_a_plain_value_is_refused():
    with pytest.raises(ValueError, match="lora holds 'none'"):
        apply_overrides({"lora": "none"}, {"lora.r": 8})


def _parser():
    parser = argparse.ArgumentParser()
    add_set_flag(parser)
    add_stop_flags(parser)
    return parser


def test_stop_flags_decode_escapes_replace_the_default_and_refuse_contradictions():
    parser = _parser()
    assert stop_from_args(parser.parse_args([]), default=(".",)) == (".",)
    assert stop_from_args(parser.parse_args(["--stop", "\\n", "--stop", "."]), default=(".",)) == ("\n", ".")
    assert stop_from_args(parser.parse_args(["--no-stop"]), default=(".",)) == ()
    with pytest.raises(ValueError, match="contradict"):
        stop_from_args(parser.parse_args(["--stop", "\\n", "--no-stop"]))
    assert decode_stop(["\\n", "\\t", "."]) == ("\n", "\t", ".")
    assert parser.parse_args(["--set", "a=1", "--set", "b=2"]).set == ["a=1", "b=2"]
