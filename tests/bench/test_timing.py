from tapeworks.bench.timing import paired_overhead


def test_paired_overhead_pairs_rounds_and_gives_quartiles():
    # Rounds: base 100/200/100/200/100 samples/s; the approach ran 80, 200,
    # 125, 160, 100 in the same rounds: overheads 25, 0, -20, 25, 0 percent.
    median, q1, q3 = paired_overhead([80, 200, 125, 160, 100], [100, 200, 100, 200, 100])
    assert abs(median - 0.0) < 1e-9
    assert abs(q1 - 0.0) < 1e-9       # inclusive quartiles of -20, 0, 0, 25, 25
    assert abs(q3 - 25.0) < 1e-9


def test_paired_overhead_of_one_round():
    assert paired_overhead([50], [100]) == (100.0, 100.0, 100.0)
