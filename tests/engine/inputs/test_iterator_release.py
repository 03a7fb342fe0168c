"""tf.data iterators tapeworks is done with are let go on a thread of their own (`iterator_release`)."""

import sys
import threading
import time
import weakref

import numpy as np
import tensorflow as tf

from tapeworks.engine.inputs import adapters, iterator_release


class Recorded:
    """Notes the thread its destructor ran on."""

    def __init__(self, seen):
        self.seen = seen

    def __del__(self):
        self.seen.append(threading.current_thread().name)


def _wait_for(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_the_destructor_runs_on_the_release_thread_not_the_callers():
    seen = []
    held = Recorded(seen)
    iterator_release.release(held)
    time.sleep(0.05)        # the caller still holds it: nothing is let go yet
    assert seen == []
    del held
    assert _wait_for(lambda: seen == ["tapeworks-iterator-release"])
    iterator_release.release(None)   # nothing to let go: no error


def test_a_reference_kept_elsewhere_keeps_the_iterator_alive():
    seen = []
    kept = Recorded(seen)
    iterator_release.release(kept)
    # The thread waits HANDOVER_SECONDS (counted in its 1 ms sleeps, longer on a
    # loaded machine) and lets go of its own reference: ours is then the only
    # one (2: the name and getrefcount's argument).
    assert _wait_for(lambda: sys.getrefcount(kept) == 2,
                     seconds=20 * iterator_release.HANDOVER_SECONDS)
    assert seen == []       # the release thread let go of its own reference only
    del kept
    assert seen == [threading.current_thread().name]


def test_a_new_pass_lets_go_of_the_last_passs_iterator_and_reads_from_the_start():
    x = np.arange(12, dtype="float32")[:, None]
    prepared = adapters.prepare(x, x, batch_size=4, shuffle=False)
    batches = adapters.EpochBatches(prepared, None)
    batches.start_epoch()
    first = batches.iterator()
    assert first.get_next()[0].numpy()[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    gone = weakref.ref(first)
    del first
    batches.restart()
    assert _wait_for(lambda: gone() is None)
    assert batches.iterator().get_next()[0].numpy()[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    batches.close()
    assert batches.iterator() is None
