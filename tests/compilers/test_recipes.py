"""The recipe registry: every named recipe is a valid compile config, and a lookup hands out a copy."""

import pytest

from compilers.config import MMGRPOConfig
from compilers.recipes import RECIPES, get_recipe


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_is_a_valid_config(name):
    cfg = MMGRPOConfig(**get_recipe(name))
    assert cfg.max_tokens == RECIPES[name]["max_tokens"]


def test_fast_is_dynamic_at_twice_the_learning_rate():
    fast, dynamic = get_recipe("fast"), get_recipe("dynamic")
    assert fast.pop("learning_rate") == pytest.approx(2 * dynamic.pop("learning_rate"))
    assert fast == dynamic


def test_get_recipe_returns_a_copy_and_names_the_known_ones():
    get_recipe("fast")["steps"] = 99
    assert "steps" not in RECIPES["fast"]
    with pytest.raises(ValueError, match="fast"):
        get_recipe("nope")


def test_concise_is_fast_with_an_overlong_penalty_and_denser_validation():
    concise, fast = get_recipe("concise"), get_recipe("fast")
    assert concise.pop("overlong_penalty") == 0.2 and concise.pop("eval_every") == 2
    fast.pop("eval_every")
    assert concise == fast


def test_finish_is_fast_with_room_for_the_answer_and_the_penalty():
    finish, fast = get_recipe("finish"), get_recipe("fast")
    assert finish.pop("max_tokens") == 20 and fast.pop("max_tokens") == 12
    assert finish.pop("overlong_penalty") == 0.2
    assert finish == fast


def test_wide_is_fast_with_twice_the_problems_at_the_same_rollouts():
    wide, fast = get_recipe("wide"), get_recipe("fast")
    assert wide.pop("examples_per_step") * wide.pop("group_size") == fast.pop("examples_per_step") * fast.pop(
        "group_size") == 32
    assert wide == fast


def test_wide_warmup_is_wide_with_the_rate_ramped_over_two_steps():
    warm, wide = get_recipe("wide-warmup"), get_recipe("wide")
    assert warm.pop("warmup_steps") == 2 and "warmup_steps" not in wide
    assert warm == wide
