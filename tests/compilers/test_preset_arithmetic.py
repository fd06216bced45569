"""compilers.presets.arithmetic (what `make demo` compiles): fixed disjoint splits, a Voting program whose every role
takes the stop strings and the calculator, and a metric that reads answers as the program uses them."""

from __future__ import annotations

import dspy

from compilers.presets import arithmetic
from compilers.recipes import get_recipe
from programs import Single, Voting
from programs.calculator import Calculate


def test_the_splits_are_fixed_and_disjoint():
    task, again = arithmetic.demo_task(), arithmetic.demo_task()
    splits = (task.trainset, task.valset, task.testset)
    assert [len(s) for s in splits] == [400, 100, 300]
    assert [[ex.question for ex in s] for s in splits] == [[ex.question for ex in s] for s in
                                                          (again.trainset, again.valset, again.testset)]
    questions = [{ex.question for ex in s} for s in splits]
    assert not questions[0] & questions[1] and not questions[0] & questions[2] and not questions[1] & questions[2]


def test_the_recipe_and_steps_name_a_registered_recipe():
    assert get_recipe(arithmetic.RECIPE)["max_tokens"] > 0 and arithmetic.STEPS > 0 and arithmetic.STOP == ()


def test_every_role_stops_at_the_given_strings_and_none_by_default():
    roles = dict(arithmetic.program(("\n",)).named_predictors())
    assert set(roles) == {"voter", "aggregator"}
    assert all(p.config.get("stop") == ("\n",) for p in roles.values())
    assert all("stop" not in p.config for _, p in arithmetic.program().named_predictors())
    program = arithmetic.program()
    assert isinstance(program, Voting) and program.skip_unanimous and program.voter.signature.instructions == \
        arithmetic.SIGNATURE.instructions
    single = arithmetic.single_program(("\n",))
    assert isinstance(single, Single) and single.solver.config.get("stop") == ("\n",)


def test_the_calculator_gives_calculate_roles_and_a_metric_that_reads_them():
    roles = dict(arithmetic.program(("\n",), calculator=True).named_predictors())
    assert all(type(p) is Calculate and p.config.get("stop") == ("\n",) for p in roles.values())
    assert all(type(p) is dspy.Predict for p in dict(arithmetic.program().named_predictors()).values())
    assert type(arithmetic.single_program(calculator=True).solver) is Calculate
    gold = dspy.Example(question="q", answer="51")
    wrote = dspy.Prediction(answer="76 - 25 = 49")
    assert arithmetic.metric(True)(gold, wrote) == 1.0 and arithmetic.metric(False)(gold, wrote) == 0.0
