from tapeworks.bench.scenarios import loops


def test_bound_with_adam_adds_adams_memory_traffic_to_the_ceiling():
    size = loops.MLPSize("tiny", (2, 3, 1), batch=4, steps=1, slow_steps=1)
    assert size.parameters() == 2 * 3 + 3 + 3 * 1 + 1
    # 13 weights x 28 bytes = 364 bytes at 1,000 bytes/s: 0.364 s; the
    # products at 40 samples/s: 0.1 s per batch of 4.
    bound = loops.bound_with_adam(size, ceiling_samples_per_s=40.0, bandwidth_gbs=1e-6)
    assert abs(bound - 4 / 0.464) < 1e-9
