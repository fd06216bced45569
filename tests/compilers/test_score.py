"""Scoring helpers: the confidence interval reported with every evaluation."""

import math

import pytest

from compilers.score import mean_interval


def test_wilson_interval_hand_worked():
    # 8 of 10 correct: Wilson 95% interval (0.490, 0.943)
    lo, hi = mean_interval([1.0] * 8 + [0.0] * 2)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    lo, hi = mean_interval([0.0] * 20)
    assert lo == 0.0 and 0.0 < hi < 0.2  # sane at 0/n
    assert mean_interval([]) == (0.0, 1.0)


def test_normal_interval_for_graded_scores():
    lo, hi = mean_interval([0.5, 0.25, 0.75, 0.5])
    assert lo < 0.5 < hi and hi - 0.5 == pytest.approx(0.5 - lo)


def test_paired_difference_by_hand():
    """before [1, 0, 0, 1], after [1, 1, 0, 0]: differences [0, 1, 0, -1], mean 0, sample variance 2/3, half-width
    1.96 * sqrt(2/3 / 4) = 0.8002; one item solved only after, one only before."""
    from compilers.score import paired_difference

    pair = paired_difference([1, 0, 0, 1], [1, 1, 0, 0])
    assert pair["difference"] == 0.0 and pair["only_after"] == 1 and pair["only_before"] == 1
    assert pair["interval"] == pytest.approx([-0.80017, 0.80017], abs=1e-5)
    assert paired_difference([0, 0], [1, 1])["interval"] == [1.0, 1.0]
    with pytest.raises(ValueError, match="equal, non-empty"):
        paired_difference([1], [1, 0])


def test_paired_difference_by_cluster_by_hand():
    """before [0, 0, 0, 0, 1, 1], after [1, 1, 0, 0, 1, 0], clusters a a b b c c: differences [1, 1, 0, 0, 0, -1],
    mean 1/6. Cluster sums minus size * mean: a 2 - 2/6 = 5/3, b 0 - 2/6 = -1/3, c -1 - 2/6 = -4/3; squares sum
    25/9 + 1/9 + 16/9 = 14/3; variance 3/2 * 14/3 / 36 = 7/36, half-width 1.96 * sqrt(7/36) = 0.86428, wider than
    the items-independent 1.96 * sqrt((102/36) / 5 / 6) = 0.60234 (the wins come by cluster)."""
    from compilers.score import paired_difference

    before, after = [0, 0, 0, 0, 1, 1], [1, 1, 0, 0, 1, 0]
    pair = paired_difference(before, after, clusters=list("aabbcc"))
    assert pair["difference"] == pytest.approx(1 / 6) and pair["clusters"] == 3
    assert pair["interval"] == pytest.approx([1 / 6 - 0.86428, 1 / 6 + 0.86428], abs=1e-5)
    assert paired_difference(before, after)["interval"] == pytest.approx([1 / 6 - 0.60234, 1 / 6 + 0.60234], abs=1e-5)
    # every item its own cluster: the items-independent interval exactly
    alone = paired_difference(before, after, clusters=list(range(6)))
    assert alone["interval"] == pytest.approx(paired_difference(before, after)["interval"])
    # one cluster: nothing to estimate the spread between clusters from
    assert paired_difference(before, after, clusters=["a"] * 6)["interval"] == [-math.inf, math.inf]
    with pytest.raises(ValueError, match="one label per item"):
        paired_difference(before, after, clusters=["a"])
