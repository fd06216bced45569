"""Scoring helpers: the confidence interval reported with every evaluation."""

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
