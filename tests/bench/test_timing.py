import math

from tapeworks.bench.timing import (
    against_target,
    median_interval,
    paired_overhead_interval,
)


def test_median_interval_is_the_order_statistics_interval():
    # Eleven values: the 95% interval of the median runs from the 2nd to the
    # 10th smallest: P(Binomial(11, 1/2) <= 1) = 12/2048 a side, coverage
    # 1 - 24/2048 = 0.988; from the 3rd to the 9th it would be 1 - 134/2048 =
    # 0.935, under 95%.
    assert median_interval([11, 3, 7, 1, 9, 5, 2, 10, 4, 8, 6]) == (6.0, 2.0, 10.0)
    # Six values: min and max cover 1 - 2/64 = 0.969.
    assert median_interval([3, 1, 2, 4, 5, 6]) == (3.5, 1.0, 6.0)


def test_median_interval_of_too_few_values_is_unbounded():
    # Five values: even min..max covers only 1 - 2/32 = 0.9375.
    assert median_interval([1, 2, 3, 4, 5]) == (3.0, -math.inf, math.inf)
    assert median_interval([5.0]) == (5.0, -math.inf, math.inf)


def test_paired_overhead_interval_pairs_rounds():
    base = [100.0] * 6
    runs = [100.0, 50.0, 80.0, 100.0, 100.0, 200.0]   # overheads 0, 100, 25, 0, 0, -50
    median, low, high = paired_overhead_interval(runs, base)
    assert (median, low, high) == (0.0, -50.0, 100.0)


def test_against_target_needs_the_whole_interval():
    assert against_target(-1.0, 1.9, 2.0) == "met"
    assert against_target(2.1, 5.0, 2.0) == "missed"
    assert against_target(1.0, 3.0, 2.0) == "inconclusive"
    assert against_target(-math.inf, math.inf, 2.0) == "inconclusive"
