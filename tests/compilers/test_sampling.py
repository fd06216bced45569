"""The example-selection stage: band, replay, curriculum, DAPO's signal rule, adaptive group sizes and the measured
curriculum, against hand-worked cases."""

import functools
import json

import pytest

from compilers.group import Group, Member
from compilers.sampling import (PromptSampler, adaptive_group_sizes, curriculum_fraction, difficulty_from_rates,
                                easiest_first, ema, group_size_for, in_band, signal_examples)
from wfc.rollout import CallNode


def test_pure_rules():
    assert in_band(None, 0.0, 1.0) and in_band(0.5, 0.0, 1.0)
    assert not in_band(0.0, 0.0, 1.0) and not in_band(1.0, 0.0, 1.0) and not in_band(0.9, 0.0, 0.9)
    assert ema(None, 0.4, 0.5) == 0.4 and ema(0.4, 1.0, 0.5) == 0.7
    # start 0.3, 10 steps: 0.3, 0.65 at step 5, capped at 1 from step 10
    assert [curriculum_fraction(s, steps=10, start=0.3) for s in (0, 5, 10, 20)] == pytest.approx([0.3, 0.65, 1, 1])
    assert curriculum_fraction(3, steps=0, start=0.3) == 1.0


def _group(example, rewards):
    call = CallNode(id=0, role="r", invocation=0, messages=[])
    return Group(example=example, role="r", invocation=0, members=[Member(call, r, i) for i, r in enumerate(rewards)])


def test_signal_examples():
    groups = [_group(0, [0, 0, 0]), _group(0, [1, 1]), _group(1, [0, 1, 0]), _group(2, [1])]
    assert signal_examples(groups, 4) == [False, True, False, False]


def test_draw_is_a_seeded_permutation_epoch_by_epoch():
    a, b = PromptSampler(10, seed=3), PromptSampler(10, seed=3)
    first = [a.draw(4) for _ in range(5)]
    assert first == [b.draw(4) for _ in range(5)]
    epoch = first[0] + first[1] + first[2][:2]
    assert sorted(epoch) == list(range(10))  # every example once before any twice
    assert all(len(set(d)) == 4 for d in first)


def test_band_skips_solved_and_replays_hard_ones():
    s = PromptSampler(6, seed=0, band=(0.0, 1.0), replay_after=2, alpha=1.0)
    for i in range(6):
        s.observe(i, {0: 1.0, 1: 0.0}.get(i, 0.5))  # 0 solved, 1 hopeless, rest in band
    drawn = s.draw(4)
    assert 0 not in drawn and 1 not in drawn and sorted(drawn) == [2, 3, 4, 5]
    assert 1 in s.replay and s.replay[1] == 2  # hopeless: back after replay_after steps
    s.advance(), s.advance()
    assert s.draw(1) == [1]  # its wait is over: drawn first
    # the band cannot be met: the draw still returns k examples
    s2 = PromptSampler(3, seed=0, band=(0.0, 1.0), alpha=1.0)
    for i in range(3):
        s2.observe(i, 1.0)
    assert sorted(s2.draw(3)) == [0, 1, 2]


def test_curriculum_opens_easiest_first():
    s = PromptSampler(10, seed=0, difficulty=[9, 8, 7, 6, 5, 4, 3, 2, 1, 0], curriculum_steps=10,
                      curriculum_start=0.2)
    assert sorted(s.draw(2)) == [8, 9]  # the two easiest
    for _ in range(10):
        s.advance()
    assert len(s._open_pool()) == 10


def test_state_round_trip_continues_the_same_draws():
    s = PromptSampler(12, seed=1, band=(0.0, 1.0))
    s.draw(5)
    s.observe(3, 0.0)
    s.advance()
    state = s.state_dict()
    t = PromptSampler(12, seed=99, band=(0.0, 1.0))
    t.load_state_dict(state)
    assert [s.draw(3) for _ in range(4)] == [t.draw(3) for _ in range(4)]


def test_bad_arguments():
    with pytest.raises(ValueError, match="empty"):
        PromptSampler(0)
    with pytest.raises(ValueError, match="band"):
        PromptSampler(3, band=(0.5, 0.5))
    with pytest.raises(ValueError, match="difficulty"):
        PromptSampler(3, difficulty=[1, 2])


def test_group_size_for_meets_the_chance_of_a_pass():
    # target 0.8, sizes in [2, 16], base 4: the smallest n with 1 - (1 - p)**n >= 0.8
    want = functools.partial(group_size_for, base=4, max_size=16, target=0.8)
    assert want(None) == 4  # unknown: the base size
    assert want(0.0) == 16  # never passes: as many as allowed
    assert want(1.0) == 2 and want(0.6) == 2  # 1 - 0.4**2 = 0.84
    assert want(0.5) == 3  # 1 - 0.5**2 = 0.75 < 0.8 <= 1 - 0.5**3 = 0.875
    assert want(0.2) == 8  # 0.8**7 = 0.2097 (0.790), 0.8**8 = 0.1678 (0.832)
    assert want(0.1) == 16 and want(0.1, max_size=32) == 16  # 0.9**15 = 0.2059 (0.794), 0.9**16 = 0.1853 (0.815)
    assert want(0.05) == 16 and want(0.05, max_size=64) == 32  # 0.95**31 = 0.2039, 0.95**32 = 0.1937
    assert want(0.5, target=0.75) == 2  # exactly on the target: met (no float shortfall)
    assert want(-0.5) == 16 and want(1.5) == 2  # clipped to [0, 1]


def test_adaptive_group_sizes_water_fill_the_budget():
    kw = dict(base=4, max_size=16, target=0.8)
    rates = [0.0, 0.5, None, 1.0]  # wants 16, 3, 4, 2 (sum 25)
    assert adaptive_group_sizes(rates, budget=100, **kw) == [16, 3, 4, 2]  # within budget: every want met
    assert adaptive_group_sizes(rates, budget=25, **kw) == [16, 3, 4, 2]
    assert adaptive_group_sizes(rates, budget=16, **kw) == [7, 3, 4, 2]  # cap 7: 7 + 3 + 4 + 2 = 16
    assert adaptive_group_sizes(rates, budget=17, **kw) == [8, 3, 4, 2]
    # all hopeless: an equal share; the remainder to the first in draw order
    assert adaptive_group_sizes([0.0] * 3, budget=9, **kw) == [3, 3, 3]
    assert adaptive_group_sizes([0.0] * 3, budget=10, **kw) == [4, 3, 3]
    assert adaptive_group_sizes([0.0] * 3, budget=11, **kw) == [4, 4, 3]
    # the remainder goes to the largest want first: wants 4, 16, 8 at budget 13 -> cap 4 (4 + 4 + 4), +1 to the 16
    assert adaptive_group_sizes([None, 0.0, 0.2], budget=13, **kw) == [4, 5, 4]
    assert adaptive_group_sizes([None, 0.0], budget=9, **kw) == [4, 5]  # cap 5: 4 + 5
    assert adaptive_group_sizes([None] * 3, budget=12, **kw) == [4, 4, 4]  # unknown rates: fixed groups
    assert adaptive_group_sizes([], budget=0, **kw) == []
    with pytest.raises(ValueError, match="at least 6"):
        adaptive_group_sizes([0.0, 0.5, 1.0], budget=5, **kw)


def test_measured_rates_order_the_curriculum_and_survive_a_resume():
    rates = [0.0, 0.75, 0.25, 0.75, 1.0]
    assert difficulty_from_rates(rates) == [1.0, 0.25, 0.75, 0.25, 0.0]
    assert easiest_first(difficulty_from_rates(rates)) == [4, 1, 3, 2, 0]  # equal rates keep trainset order
    s = PromptSampler(5, seed=0, curriculum_steps=4, curriculum_start=0.4)
    s.prime(rates, order=True)
    assert s.by_difficulty == [4, 1, 3, 2, 0] and s.rates == dict(enumerate(rates)) and s.seen == {}
    assert sorted(s.draw(2)) == [1, 4]  # 40% open: the two most often passed
    s.observe(1, 0.25)  # the probe's rate is the first observation of the EMA: (0.75 + 0.25) / 2
    assert s.rates[1] == 0.5 and s.seen == {1: 1}
    s.advance()
    state = json.loads(json.dumps(s.state_dict()))  # JSON-able, as the checkpoint stores it
    t = PromptSampler(5, seed=0, curriculum_steps=4, curriculum_start=0.4)
    t.load_state_dict(state)
    assert t.by_difficulty == s.by_difficulty and t.rates == s.rates
    assert [s.draw(2) for _ in range(3)] == [t.draw(2) for _ in range(3)]
    old = {k: v for k, v in state.items() if k != "order"}  # a checkpoint from before the order was saved
    u = PromptSampler(5, seed=0, difficulty=[5, 4, 3, 2, 1])
    u.load_state_dict(old)
    assert u.by_difficulty == [4, 3, 2, 1, 0]
    unordered = PromptSampler(5, seed=0)
    unordered.prime(rates, order=False)  # rates only: the order stays the trainset's
    assert unordered.by_difficulty == [0, 1, 2, 3, 4] and unordered.rates[4] == 1.0
    with pytest.raises(ValueError, match="one per example"):
        unordered.prime([0.5], order=True)
