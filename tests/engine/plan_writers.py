"""A plan-cache writer for the concurrent-writers test, in a module of its own.

The test's processes are spawned: each imports the module that holds its
target. This one imports no TensorFlow, so they start at once instead of
after about 10 s of imports each.
"""

from tapeworks.engine.plan.plan_cache import PlanCache


def write_many(folder, worker):
    cache = PlanCache(folder)
    for i in range(200):
        # Steps per call 1-200: values a run writes (the cache refuses others).
        cache.put("shared", bool(i % 2), i + 1, "race", {"worker": worker})
