"""The example-selection stage: band, replay, curriculum and DAPO's signal rule, against hand-worked cases."""

import pytest

from compilers.group import Group, Member
from compilers.sampling import PromptSampler, curriculum_fraction, ema, in_band, signal_examples
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
