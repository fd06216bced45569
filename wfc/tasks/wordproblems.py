"""Generated one- and two-step word problems in SVAMP's shape, for training that transfers to SVAMP:
:func:`make_wordproblems`.

Each problem is a short body and a question, e.g.::

    Nina has 18 stickers. She puts 3 stickers in each box. How many boxes does she fill?        -> "6"
    Omar had $ 40. He bought 3 kites for $ 9 each. How much money does he have left?           -> "13"

The templates are our own (SVAMP is evaluation only: nothing here is copied from it). :data:`KINDS` names them:
combining two or three amounts, change (result, change or start unknown), comparison ("how many more / fewer",
"k more than", "k times as many", inverse wording), equal groups, equal sharing, prices (total, unit price, count,
money left), rates, two-step stories, and stories whose body holds a number the answer must not use. Names,
objects, containers, goods and the way money is written (``$ 5``, ``$5``, ``5 dollars``) vary.

Fields: ``question`` (the only input), ``answer`` (the canonical number string, :func:`format_number`), and two
labels that are never prompt inputs: ``kind`` (a name from :data:`KINDS`) and ``difficulty``:

- 0: one operation, no distractor;
- 1: one operation with a distractor number (a template that has one, or an irrelevant sentence added to a
  level-0 template), or with the start or the change unknown, or inverse comparison wording;
- 2: two operations.

Invariants: every number written in a question is an integer in ``1..max_operand`` (answers may be larger:
products, sums); every answer is a non-negative integer (divisions are exact); the questions are distinct; the same
arguments give the same problems (a local ``random.Random(seed)``, never the global RNG), and problem ``i`` does
not depend on ``n`` (``make_wordproblems(5)`` is a prefix of ``make_wordproblems(10)``). Asking for more distinct
problems than the chosen kinds and ``max_operand`` allow raises ``ValueError`` (no endless search).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Iterable

import dspy

from wfc.tasks.math import format_number

MIN_OPERAND = 5  # the smallest max_operand for which every template has numbers to draw
MAX_DUPLICATE_DRAWS = 2000  # consecutive repeated questions after which the generator gives up
DISTRACTOR_RATE = 0.3  # share of level-0 problems that get an irrelevant sentence (and become level 1)

NAMES = (
    ("Tom", "he", "him", "his"), ("Mia", "she", "her", "her"), ("Sam", "he", "him", "his"),
    ("Ana", "she", "her", "her"), ("Leo", "he", "him", "his"), ("Zoe", "she", "her", "her"),
    ("Raj", "he", "him", "his"), ("Ivy", "she", "her", "her"), ("Omar", "he", "him", "his"),
    ("Nina", "she", "her", "her"), ("Carlos", "he", "him", "his"), ("Grace", "she", "her", "her"),
    ("Yuki", "she", "her", "her"), ("Hassan", "he", "him", "his"), ("Emma", "she", "her", "her"),
    ("Noah", "he", "him", "his"), ("Priya", "she", "her", "her"), ("Felix", "he", "him", "his"),
)
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "books", "shells", "cards", "stamps", "crayons",
         "balloons", "oranges", "cupcakes", "buttons", "feathers", "beads", "erasers", "toy cars", "ribbons",
         "walnuts", "muffins", "peaches", "rocks", "coins")
FOODS = ("apples", "cookies", "oranges", "cupcakes", "muffins", "peaches", "walnuts", "grapes", "crackers",
         "strawberries")
ADJECTIVES = ("red", "blue", "green", "yellow", "big", "small", "old", "new")
CONTAINERS = (("box", "boxes"), ("bag", "bags"), ("pack", "packs"), ("basket", "baskets"), ("jar", "jars"))
GOODS = (("notebook", "notebooks"), ("pen", "pens"), ("ticket", "tickets"), ("sandwich", "sandwiches"),
         ("toy", "toys"), ("shirt", "shirts"), ("comic book", "comic books"), ("plant", "plants"),
         ("kite", "kites"), ("mug", "mugs"), ("ball", "balls"), ("puzzle", "puzzles"), ("hat", "hats"),
         ("book", "books"), ("pie", "pies"))
RATES = (("reads", "read", "pages"), ("swims", "swim", "laps"), ("bakes", "bake", "muffins"),
         ("writes", "write", "lines"), ("runs", "run", "miles"), ("folds", "fold", "paper cranes"),
         ("picks", "pick", "strawberries"), ("paints", "paint", "pictures"))
PLACES = ("park", "beach", "garden", "playground", "library", "school")
RELATIVES = ("sister", "brother", "cousin", "dog", "cat", "grandmother")
MONEY_STYLES = ("$ {}", "${}", "{} dollars")


@dataclass(frozen=True)
class _Person:
    name: str
    subj: str  # he / she
    obj: str  # him / her
    poss: str  # his / her

    @property
    def Subj(self) -> str:  # noqa: N802 - sentence-initial pronoun
        return self.subj.capitalize()


class _Ctx:
    """What one problem draws from: the RNG, the operand bound, three people, two item kinds, a money style."""

    def __init__(self, rng: random.Random, max_operand: int):
        self.rng = rng
        self.M = max_operand
        people = rng.sample(NAMES, 3)
        self.a, self.b, self.c = (_Person(*p) for p in people)
        self.x, self.y = rng.sample(ITEMS, 2)
        self.money_style = rng.choice(MONEY_STYLES)

    def r(self, lo: int, hi: int) -> int:
        assert lo <= hi, (lo, hi)
        return self.rng.randint(lo, hi)

    def pick(self, options):
        return self.rng.choice(options)

    def money(self, value: int) -> str:
        return self.money_style.format(value)

    def goods(self, k: int = 1):
        return self.rng.sample(GOODS, k) if k > 1 else self.rng.choice(GOODS)


# A template returns (body sentences, question, answer). Every phrasing of one kind writes its numbers in the same
# order, which the tests rely on to recompute answers from the question alone.
_Template = Callable[[_Ctx], tuple[list[str], str, int]]


# ----- one operation (difficulty 0) ---------------------------------------------------------------------------------
def _combine(c: _Ctx):
    a, b = c.r(2, c.M), c.r(2, c.M)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} has {a} {x}.", f"{q.name} has {b} {x}."], f"How many {x} do they have altogether?"),
        ([f"{p.name} picked {a} {x} on Monday.", f"{p.Subj} picked {b} more {x} on Tuesday."],
         f"How many {x} did {p.name} pick in all?"),
        ([f"There are {a} {x} on the table and {b} {x} in the basket."], f"How many {x} are there in total?"),
    ])
    return body, question, a + b


def _combine_types(c: _Ctx):
    a, b = c.r(2, c.M), c.r(2, c.M)
    p, x = c.a, c.x
    adj1, adj2 = c.rng.sample(ADJECTIVES, 2)
    body, question = c.pick([
        ([f"{p.name} has {a} {adj1} {x} and {b} {adj2} {x}."], f"How many {x} does {p.name} have?"),
        ([f"In a jar there are {a} {adj1} {x}.", f"There are also {b} {adj2} {x} in the jar."],
         f"How many {x} are in the jar altogether?"),
    ])
    return body, question, a + b


def _increase(c: _Ctx):
    a, b = c.r(2, c.M), c.r(2, c.M)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} had {a} {x}.", f"{q.name} gave {p.obj} {b} more {x}."], f"How many {x} does {p.name} have now?"),
        ([f"{p.name} has {a} {x}."], f"If {p.subj} buys {b} more {x}, how many {x} will {p.subj} have?"),
        ([f"There were {a} {x} in a box.", f"{p.name} put {b} more {x} in the box."],
         f"How many {x} are in the box now?"),
    ])
    return body, question, a + b


def _decrease(c: _Ctx):
    a = c.r(3, c.M)
    b = c.r(2, a - 1)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} had {a} {x}.", f"{p.Subj} gave {b} of them to {q.name}."],
         f"How many {x} does {p.name} have left?"),
        ([f"{p.name} has {a} {x}."], f"If {p.subj} loses {b} of them, how many {x} will {p.subj} have left?"),
        ([f"There were {a} {x} in a bowl.", f"{p.name} took {b} {x} out of the bowl."],
         f"How many {x} are still in the bowl?"),
    ])
    return body, question, a - b


def _two_amounts(c: _Ctx) -> tuple[int, int]:
    a = c.r(3, c.M)
    return a, c.r(2, a - 1)


def _compare_more(c: _Ctx):
    a, b = _two_amounts(c)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} has {a} {x}.", f"{q.name} has {b} {x}."], f"How many more {x} does {p.name} have than {q.name}?"),
        ([f"{p.name} collected {a} {x} and {q.name} collected {b} {x}."],
         f"How many more {x} did {p.name} collect than {q.name}?"),
    ])
    return body, question, a - b


def _compare_fewer(c: _Ctx):
    a, b = _two_amounts(c)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} has {a} {x}.", f"{q.name} has {b} {x}."], f"How many fewer {x} does {q.name} have than {p.name}?"),
        ([f"{p.name} made {a} {x} and {q.name} made {b} {x}."],
         f"How many fewer {x} did {q.name} make than {p.name}?"),
    ])
    return body, question, a - b


def _compare_larger(c: _Ctx):
    b, k = c.r(2, c.M), c.r(2, c.M)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{q.name} has {b} {x}.", f"{p.name} has {k} more {x} than {q.name}."], f"How many {x} does {p.name} have?"),
        ([f"{q.name} found {b} {x} at the {c.pick(PLACES)}.", f"{p.name} found {k} more {x} than {q.name}."],
         f"How many {x} did {p.name} find?"),
    ])
    return body, question, b + k


def _compare_smaller(c: _Ctx):
    a = c.r(3, c.M)
    k = c.r(2, a - 1)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} has {a} {x}.", f"{q.name} has {k} fewer {x} than {p.name}."], f"How many {x} does {q.name} have?"),
        ([f"{p.name} sold {a} {x}.", f"{q.name} sold {k} {x} less than {p.name}."], f"How many {x} did {q.name} sell?"),
    ])
    return body, question, a - k


def _times_as_many(c: _Ctx):
    b, k = c.r(2, c.M), c.r(2, min(5, c.M))
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{q.name} has {b} {x}.", f"{p.name} has {k} times as many {x} as {q.name}."],
         f"How many {x} does {p.name} have?"),
        ([f"{q.name} baked {b} {x}.", f"{p.name} baked {k} times as many {x} as {q.name}."],
         f"How many {x} did {p.name} bake?"),
    ])
    return body, question, b * k


def _groups_total(c: _Ctx):
    n, k = c.r(2, c.M), c.r(2, c.M)
    p, x = c.a, c.x
    box, boxes = c.pick(CONTAINERS)
    body, question = c.pick([
        ([f"{p.name} has {n} {boxes}.", f"Each {box} holds {k} {x}."], f"How many {x} does {p.name} have in all?"),
        ([f"{p.name} bought {n} {boxes} of {x} with {k} {x} in each {box}."], f"How many {x} did {p.name} buy?"),
        ([f"There are {n} {boxes} on a shelf.", f"There are {k} {x} in every {box}."],
         f"How many {x} are on the shelf?"),
    ])
    return body, question, n * k


def _groups_count(c: _Ctx):
    k = c.r(2, c.M // 2)
    t = k * c.r(2, c.M // k)
    p, x = c.a, c.x
    box, boxes = c.pick(CONTAINERS)
    body, question = c.pick([
        ([f"{p.name} has {t} {x}.", f"{p.Subj} puts {k} {x} in each {box}."], f"How many {boxes} does {p.subj} fill?"),
        ([f"{p.name} packed {t} {x} into {boxes}, {k} {x} in every {box}."], f"How many {boxes} did {p.subj} use?"),
    ])
    return body, question, t // k


def _share_each(c: _Ctx):
    n = c.r(2, c.M // 2)
    t = n * c.r(2, c.M // n)
    p, x = c.a, c.x
    body, question = c.pick([
        ([f"{p.name} has {t} {x}.", f"{p.Subj} shares them equally among {n} friends."],
         f"How many {x} does each friend get?"),
        ([f"{p.name} split {t} {x} equally into {n} groups."], f"How many {x} are in each group?"),
    ])
    return body, question, t // n


def _price_total(c: _Ctx):
    price, n = c.r(2, c.M), c.r(2, c.M)
    p = c.a
    good, goods = c.goods()
    body, question = c.pick([
        ([f"Each {good} costs {c.money(price)}.", f"{p.name} buys {n} {goods}."], f"How much does {p.subj} spend?"),
        ([f"{p.name} bought {n} {goods} for {c.money(price)} each."], f"How much money did {p.subj} spend?"),
    ])
    return body, question, price * n


def _price_each(c: _Ctx):
    n = c.r(2, c.M // 2)
    t = n * c.r(2, c.M // n)
    p = c.a
    good, goods = c.goods()
    body, question = c.pick([
        ([f"{p.name} paid {c.money(t)} for {n} {goods}.", f"Each {good} cost the same amount."],
         f"How much did each {good} cost?"),
        ([f"{p.name} spent {c.money(t)} on {n} {goods} that all have the same price."],
         f"What is the price of one {good}?"),
    ])
    return body, question, t // n


def _price_count(c: _Ctx):
    price = c.r(2, c.M // 2)
    t = price * c.r(2, c.M // price)
    p = c.a
    good, goods = c.goods()
    body, question = c.pick([
        ([f"{p.name} spent {c.money(t)} on {goods}.", f"Each {good} cost {c.money(price)}."],
         f"How many {goods} did {p.subj} buy?"),
        ([f"{p.name} has {c.money(t)}."], f"If one {good} costs {c.money(price)}, how many {goods} can {p.subj} buy?"),
    ])
    return body, question, t // price


def _money_left(c: _Ctx):
    m = c.r(3, c.M)
    s = c.r(2, m - 1)
    p = c.a
    good, _ = c.goods()
    body, question = c.pick([
        ([f"{p.name} had {c.money(m)}.", f"{p.Subj} spent {c.money(s)} on a {good}."],
         f"How much money does {p.subj} have left?"),
        ([f"{p.name} has {c.money(m)} in {p.poss} wallet."],
         f"If {p.subj} pays {c.money(s)} for a {good}, how much money will be left in {p.poss} wallet?"),
    ])
    return body, question, m - s


def _rate_total(c: _Ctx):
    k, n = c.r(2, c.M), c.r(2, c.M)
    p = c.a
    verb_s, verb, unit = c.pick(RATES)
    body, question = c.pick([
        ([f"{p.name} {verb_s} {k} {unit} every day."], f"How many {unit} does {p.subj} {verb} in {n} days?"),
        ([f"Every day {p.name} {verb_s} {k} {unit}.", f"{p.Subj} does this for {n} days."],
         f"How many {unit} does {p.subj} {verb} altogether?"),
    ])
    return body, question, k * n


# ----- one operation, start or change unknown, inverse wording, or a distractor (difficulty 1) ---------------------
def _change_unknown_gain(c: _Ctx):
    a = c.r(2, c.M - 2)
    total = c.r(a + 2, c.M)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} had {a} {x}.", f"After {q.name} gave {p.obj} some more, {p.subj} has {total} {x}."],
         f"How many {x} did {q.name} give {p.obj}?"),
        ([f"There were {a} {x} in a basket.", f"{p.name} added some {x} and now there are {total} {x}."],
         f"How many {x} did {p.name} add?"),
    ])
    return body, question, total - a


def _change_unknown_loss(c: _Ctx):
    a = c.r(4, c.M)
    left = c.r(2, a - 2)
    p, q, x = c.a, c.b, c.x
    food = c.pick(FOODS)
    body, question = c.pick([
        ([f"{p.name} had {a} {x}.", f"{p.Subj} gave some of them to {q.name} and now has {left} {x} left."],
         f"How many {x} did {p.subj} give away?"),
        ([f"There were {a} {food} on a plate.", f"After {p.name} ate some, there are {left} {food} on the plate."],
         f"How many {food} did {p.name} eat?"),
    ])
    return body, question, a - left


def _start_unknown_gain(c: _Ctx):
    b = c.r(2, c.M - 2)
    total = c.r(b + 2, c.M)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} found {b} {x} at the {c.pick(PLACES)}.", f"Now {p.subj} has {total} {x}."],
         f"How many {x} did {p.subj} have at first?"),
        ([f"{q.name} gave {p.name} {b} {x}.", f"Now {p.name} has {total} {x}."],
         f"How many {x} did {p.name} have before?"),
    ])
    return body, question, total - b


def _start_unknown_loss(c: _Ctx):
    b, left = c.r(2, c.M), c.r(2, c.M)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} gave {b} {x} to {q.name}.", f"Now {p.subj} has {left} {x} left."],
         f"How many {x} did {p.subj} have at first?"),
        ([f"{p.name} sold {b} {x} at the market.", f"{p.Subj} has {left} {x} left."],
         f"How many {x} did {p.subj} have to begin with?"),
    ])
    return body, question, b + left


def _part_whole(c: _Ctx):
    t = c.r(4, c.M)
    a = c.r(2, t - 2)
    p, q, x = c.a, c.b, c.x
    adj = c.pick(ADJECTIVES)
    body, question = c.pick([
        ([f"{p.name} and {q.name} have {t} {x} together.", f"{p.name} has {a} of them."],
         f"How many {x} does {q.name} have?"),
        ([f"There are {t} {x} in a bag.", f"{a} of them are {adj} and the rest are not."],
         f"How many {x} in the bag are not {adj}?"),
    ])
    return body, question, t - a


def _compare_inverse_fewer(c: _Ctx):
    k, a = c.r(2, c.M), c.r(2, c.M)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} has {k} fewer {x} than {q.name}.", f"{p.name} has {a} {x}."], f"How many {x} does {q.name} have?"),
        ([f"{p.name} picked {k} {x} less than {q.name}.", f"{p.name} picked {a} {x}."],
         f"How many {x} did {q.name} pick?"),
    ])
    return body, question, a + k


def _compare_inverse_more(c: _Ctx):
    a = c.r(4, c.M)
    k = c.r(2, a - 2)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} has {a} {x}.", f"{p.Subj} has {k} more {x} than {q.name}."], f"How many {x} does {q.name} have?"),
        ([f"{p.name} scored {a} points.", f"That is {k} points more than {q.name} scored."],
         f"How many points did {q.name} score?"),
    ])
    return body, question, a - k


def _distractor_decrease(c: _Ctx):
    a = c.r(3, c.M)
    d, b = c.r(2, c.M), c.r(2, a - 1)
    p, x, y = c.a, c.x, c.y
    body, question = c.pick([
        ([f"{p.name} had {a} {x} and {d} {y}.", f"{p.Subj} gave away {b} {x}."],
         f"How many {x} does {p.subj} have now?"),
        ([f"A shop had {a} {x} and {d} {y}.", f"{p.name} bought {b} {x} from the shop."],
         f"How many {x} does the shop have left?"),
    ])
    return body, question, a - b


def _distractor_increase(c: _Ctx):
    a, d, b = c.r(2, c.M), c.r(2, c.M), c.r(2, c.M)
    p, q, x, y = c.a, c.b, c.x, c.y
    body, question = c.pick([
        ([f"{p.name} has {a} {x} and {d} {y}.", f"{q.name} gives {p.obj} {b} more {x}."],
         f"How many {x} does {p.name} have now?"),
        ([f"A box holds {a} {x} and {d} {y}.", f"{p.name} puts {b} more {x} into the box."],
         f"How many {x} are in the box now?"),
    ])
    return body, question, a + b


def _distractor_compare(c: _Ctx):
    a = c.r(3, c.M)
    d, b = c.r(2, c.M), c.r(2, a - 1)
    p, q, x, y = c.a, c.b, c.x, c.y
    body, question = c.pick([
        ([f"{p.name} has {a} {x} and {d} {y}.", f"{q.name} has {b} {x}."],
         f"How many more {x} does {p.name} have than {q.name}?"),
        ([f"{p.name} bought {a} {x} and {d} {y}.", f"{q.name} bought {b} {x}."],
         f"How many fewer {x} did {q.name} buy than {p.name}?"),
    ])
    return body, question, a - b


def _distractor_price(c: _Ctx):
    price, other, n = c.r(2, c.M), c.r(2, c.M), c.r(2, c.M)
    p = c.a
    (good, goods), (good2, _) = c.goods(2)
    body, question = c.pick([
        ([f"A {good} costs {c.money(price)} and a {good2} costs {c.money(other)}.", f"{p.name} buys {n} {goods}."],
         f"How much does {p.subj} pay?"),
        ([f"At the fair a {good} is {c.money(price)} and a {good2} is {c.money(other)}.",
          f"{p.name} wants {n} {goods}."], f"How much money does {p.subj} need?"),
    ])
    return body, question, price * n


# ----- two operations (difficulty 2) --------------------------------------------------------------------------------
def _combine_three(c: _Ctx):
    a, b, d = c.r(2, c.M), c.r(2, c.M), c.r(2, c.M)
    p, q, s, x = c.a, c.b, c.c, c.x
    body, question = c.pick([
        ([f"{p.name} has {a} {x}, {q.name} has {b} {x} and {s.name} has {d} {x}."],
         f"How many {x} do they have in all?"),
        ([f"{p.name} collected {a} {x} on Monday, {b} on Tuesday and {d} on Wednesday."],
         f"How many {x} did {p.subj} collect in those days?"),
    ])
    return body, question, a + b + d


def _buy_then_give(c: _Ctx):
    a, b = c.r(2, c.M), c.r(2, c.M)
    g = c.r(2, min(c.M, a + b - 1))
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} had {a} {x}.", f"{p.Subj} bought {b} more and then gave {g} to {q.name}."],
         f"How many {x} does {p.name} have now?"),
        ([f"There were {a} {x} in the jar.", f"{p.name} added {b} {x}, then {q.name} took out {g} {x}."],
         f"How many {x} are in the jar now?"),
    ])
    return body, question, a + b - g


def _lose_then_find(c: _Ctx):
    a = c.r(3, c.M)
    b, f = c.r(2, a - 1), c.r(2, c.M)
    p, x = c.a, c.x
    body, question = c.pick([
        ([f"{p.name} had {a} {x}.", f"{p.Subj} lost {b} of them, but later found {f} more."],
         f"How many {x} does {p.subj} have now?"),
        ([f"A shop had {a} {x}.", f"It sold {b} {x} in the morning and got a delivery of {f} {x} in the afternoon."],
         f"How many {x} does the shop have at the end of the day?"),
    ])
    return body, question, a - b + f


def _groups_then_remove(c: _Ctx):
    n, k = c.r(2, c.M), c.r(2, c.M)
    e = c.r(2, min(c.M, n * k - 1))
    p, x = c.a, c.x
    box, boxes = c.pick(CONTAINERS)
    body, question = c.pick([
        ([f"{p.name} bought {n} {boxes} of {x} with {k} {x} in each {box}.", f"{p.Subj} gave {e} {x} to friends."],
         f"How many {x} does {p.subj} have left?"),
        ([f"There are {n} {boxes} with {k} {x} in each.", f"{p.name} takes {e} {x}."],
         f"How many {x} are left in the {boxes}?"),
    ])
    return body, question, n * k - e


def _combine_then_share(c: _Ctx):
    n = c.r(2, c.M)
    t = n * c.r(2, 2 * c.M // n)
    a = c.r(max(2, t - c.M), min(c.M, t - 2))
    b = t - a
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} picked {a} {x} and {q.name} picked {b} {x}.",
          f"They put them together and shared them equally among {n} children."],
         f"How many {x} did each child get?"),
        ([f"{p.name} has {a} {x} and {q.name} has {b} {x}.", f"They pack all of them into {n} bags equally."],
         f"How many {x} go in each bag?"),
    ])
    return body, question, t // n


def _money_after_purchase(c: _Ctx):
    price = c.r(2, (c.M - 1) // 2)
    n = c.r(2, (c.M - 1) // price)
    m = c.r(n * price + 1, c.M)
    p = c.a
    _, goods = c.goods()
    body, question = c.pick([
        ([f"{p.name} had {c.money(m)}.", f"{p.Subj} bought {n} {goods} for {c.money(price)} each."],
         f"How much money does {p.subj} have left?"),
        ([f"{p.name} has {c.money(m)}."],
         f"If {p.subj} buys {n} {goods} that cost {c.money(price)} each, how much money will {p.subj} have left?"),
    ])
    return body, question, m - n * price


def _spent_two(c: _Ctx):
    m = c.r(5, c.M)
    s1 = c.r(2, m - 3)
    s2 = c.r(2, m - 1 - s1)
    p = c.a
    (good, _), (good2, _) = c.goods(2)
    body, question = c.pick([
        ([f"{p.name} had {c.money(m)}.", f"{p.Subj} spent {c.money(s1)} on a {good} and {c.money(s2)} on a {good2}."],
         f"How much money does {p.subj} have left?"),
        ([f"{p.name} took {c.money(m)} to the store.", f"A {good} cost {c.money(s1)} and a {good2} cost "
          f"{c.money(s2)}, and {p.subj} bought one of each."], f"How much money did {p.subj} bring home?"),
    ])
    return body, question, m - s1 - s2


def _compare_total(c: _Ctx):
    a, k = c.r(2, c.M), c.r(2, c.M)
    p, q, x = c.a, c.b, c.x
    body, question = c.pick([
        ([f"{p.name} has {a} {x}.", f"{q.name} has {k} more {x} than {p.name}."],
         f"How many {x} do they have together?"),
        ([f"{p.name} made {a} {x}.", f"{q.name} made {k} more {x} than {p.name} did."],
         f"How many {x} did the two of them make in all?"),
    ])
    return body, question, a + a + k


def _start_unknown_two(c: _Ctx):
    b, g, left = c.r(2, c.M), c.r(2, c.M), c.r(2, c.M)
    p, q, s, x = c.a, c.b, c.c, c.x
    food = c.pick(FOODS)
    body, question = c.pick([
        ([f"{p.name} gave {b} {x} to {q.name} and {g} {x} to {s.name}.", f"Now {p.subj} has {left} {x} left."],
         f"How many {x} did {p.subj} have at first?"),
        ([f"{p.name} ate {b} {food} in the morning and {g} {food} in the evening.",
          f"{p.Subj} has {left} {food} left."], f"How many {food} did {p.subj} have at the start of the day?"),
    ])
    return body, question, b + g + left


def _price_two_kinds(c: _Ctx):
    n, price, other = c.r(2, c.M), c.r(2, c.M), c.r(2, c.M)
    p = c.a
    (_, goods), (good2, _) = c.goods(2)
    body, question = c.pick([
        ([f"{p.name} bought {n} {goods} for {c.money(price)} each and a {good2} for {c.money(other)}."],
         f"How much did {p.subj} spend in all?"),
        ([f"{p.name} buys {n} {goods} at {c.money(price)} each.", f"{p.Subj} also buys a {good2} for "
          f"{c.money(other)}."], f"How much does {p.subj} pay altogether?"),
    ])
    return body, question, n * price + other


# kind -> (template, difficulty without an added distractor)
_TEMPLATES: dict[str, tuple[_Template, int]] = {
    "combine": (_combine, 0),
    "combine_types": (_combine_types, 0),
    "increase": (_increase, 0),
    "decrease": (_decrease, 0),
    "compare_more": (_compare_more, 0),
    "compare_fewer": (_compare_fewer, 0),
    "compare_larger": (_compare_larger, 0),
    "compare_smaller": (_compare_smaller, 0),
    "times_as_many": (_times_as_many, 0),
    "groups_total": (_groups_total, 0),
    "groups_count": (_groups_count, 0),
    "share_each": (_share_each, 0),
    "price_total": (_price_total, 0),
    "price_each": (_price_each, 0),
    "price_count": (_price_count, 0),
    "money_left": (_money_left, 0),
    "rate_total": (_rate_total, 0),
    "change_unknown_gain": (_change_unknown_gain, 1),
    "change_unknown_loss": (_change_unknown_loss, 1),
    "start_unknown_gain": (_start_unknown_gain, 1),
    "start_unknown_loss": (_start_unknown_loss, 1),
    "part_whole": (_part_whole, 1),
    "compare_inverse_fewer": (_compare_inverse_fewer, 1),
    "compare_inverse_more": (_compare_inverse_more, 1),
    "distractor_decrease": (_distractor_decrease, 1),
    "distractor_increase": (_distractor_increase, 1),
    "distractor_compare": (_distractor_compare, 1),
    "distractor_price": (_distractor_price, 1),
    "combine_three": (_combine_three, 2),
    "buy_then_give": (_buy_then_give, 2),
    "lose_then_find": (_lose_then_find, 2),
    "groups_then_remove": (_groups_then_remove, 2),
    "combine_then_share": (_combine_then_share, 2),
    "money_after_purchase": (_money_after_purchase, 2),
    "spent_two": (_spent_two, 2),
    "compare_total": (_compare_total, 2),
    "start_unknown_two": (_start_unknown_two, 2),
    "price_two_kinds": (_price_two_kinds, 2),
}
KINDS: tuple[str, ...] = tuple(_TEMPLATES)


def _distractor(c: _Ctx, *, last: bool) -> str:
    """An irrelevant sentence with one number (1..max_operand) that the answer must not use. ``last``: it goes right
    before the question, where "also" reads naturally."""
    d = c.r(2, c.M)
    p, q = c.a, c.b
    options = [
        f"{q.name}'s {c.pick(RELATIVES)} is {d} years old.",
        f"The {c.pick(PLACES)} is {d} miles away from {p.poss} house.",
        f"The temperature outside was {d} degrees.",
    ]
    if last:
        other = c.pick([i for i in ITEMS if i not in (c.x, c.y)])
        options.append(f"{p.name} also has {d} {other}.")
    return c.pick(options)


def _check_args(n: int, seed: int, max_operand: int, kinds: Iterable[str] | None) -> tuple[str, ...]:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if not isinstance(max_operand, int) or isinstance(max_operand, bool) or max_operand < MIN_OPERAND:
        raise ValueError(f"max_operand must be an int >= {MIN_OPERAND} (the smallest bound every template can "
                         f"draw from; 50 is the default), got {max_operand!r}")
    if kinds is None:
        return KINDS
    if isinstance(kinds, str):
        raise ValueError(f"kinds must be a list of kind names (e.g. [{kinds!r}]), not a string")
    chosen = tuple(dict.fromkeys(kinds))
    if not chosen:
        raise ValueError("kinds must not be empty: pass None for all kinds, or names from "
                         "wfc.tasks.wordproblems.KINDS")
    unknown = [k for k in chosen if k not in _TEMPLATES]
    if unknown:
        raise ValueError(f"unknown kinds {unknown}: choose names from wfc.tasks.wordproblems.KINDS {list(KINDS)}")
    return chosen


def _problem(rng: random.Random, kind: str, max_operand: int) -> dspy.Example:
    template, difficulty = _TEMPLATES[kind]
    ctx = _Ctx(rng, max_operand)
    body, question, answer = template(ctx)
    if difficulty == 0 and rng.random() < DISTRACTOR_RATE:
        at = rng.randint(1, len(body))
        body = body[:at] + [_distractor(ctx, last=at == len(body))] + body[at:]
        difficulty = 1
    assert isinstance(answer, int) and answer >= 0, (kind, answer)
    text = " ".join(body + [question])
    return dspy.Example(question=text, answer=format_number(answer), kind=kind,
                        difficulty=difficulty).with_inputs("question")


def make_wordproblems(n: int, *, seed: int = 0, max_operand: int = 50,
                      kinds: Iterable[str] | None = None) -> list[dspy.Example]:
    """``n`` distinct word problems as ``dspy.Example(question, answer, kind, difficulty)`` with input ``question``.

    ``kinds``: names from :data:`KINDS` to draw from (default: all). Kinds take turns in a shuffled order per round,
    so every chosen kind appears about equally often. ``ValueError`` for bad arguments, or when the kinds and
    ``max_operand`` cannot give ``n`` distinct questions (see the module docstring).
    """
    chosen = _check_args(n, seed, max_operand, kinds)
    rng = random.Random(seed)
    examples: list[dspy.Example] = []
    seen: set[str] = set()
    order: list[str] = []
    repeats = 0
    while len(examples) < n:
        if not order:
            order = list(chosen)
            rng.shuffle(order)
        example = _problem(rng, order.pop(), max_operand)
        if example.question in seen:
            repeats += 1
            if repeats >= MAX_DUPLICATE_DRAWS:
                raise ValueError(
                    f"found only {len(examples)} distinct word problems for n={n} ({MAX_DUPLICATE_DRAWS} draws in a "
                    f"row repeated earlier ones): ask for fewer, raise max_operand (now {max_operand}) or allow more "
                    f"kinds")
            continue
        repeats = 0
        seen.add(example.question)
        examples.append(example)
    return examples
