"""Checkpoints written by the code before the Trainer's split still load, bit for bit.

The fixtures in tests/fixtures/pre_split/ were written once by `make.py` there,
at commit dd50b96 (before `engine/trainer.py` was split): a `fit(checkpoint_dir=)`
folder and a `trainer.checkpoint` write, with every variable's value after that fit.
"""

import os
import shutil

import numpy as np

from tests.fixtures.pre_split import make

FIXTURES = os.path.dirname(make.__file__)


def assert_same(found, expected, exact=True):
    """Every value equal, bit for bit (or, `exact=False`, within float32 rounding of another CPU)."""
    assert sorted(found) == sorted(expected)
    for name in expected:
        if exact:
            np.testing.assert_array_equal(found[name], expected[name], err_msg=name)
        else:
            np.testing.assert_allclose(found[name], expected[name], rtol=1e-5, atol=1e-6,
                                       err_msg=name)


def test_run_folder_written_before_the_split_resumes_as_finished(tmp_path):
    expected = dict(np.load(os.path.join(FIXTURES, "expected.npz")))
    folder = tmp_path / "run"
    shutil.copytree(os.path.join(FIXTURES, "run"), folder)
    trainer = make.build()
    x, y = make.data()
    history = trainer.fit(x, y, batch_size=8, epochs=2, verbose=0, checkpoint_dir=str(folder))
    assert history.history == {}   # nothing left to train
    assert_same(make.values(trainer), expected)


def test_run_folder_written_before_the_split_goes_on_as_an_uninterrupted_run(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(os.path.join(FIXTURES, "run"), folder)
    x, y = make.data()
    resumed = make.build()
    resumed.fit(x, y, batch_size=8, epochs=3, verbose=0, checkpoint_dir=str(folder))
    straight = make.build()
    straight.fit(x, y, batch_size=8, epochs=3, verbose=0,
                 checkpoint_dir=str(tmp_path / "straight"))
    # The fixture's first two epochs ran on the CPU that wrote it; a CPU with
    # other matmul kernels (AVX2 against AVX-512) rounds them a few ulps
    # apart, and its straight run continues from its own epoch-2 state. Bit
    # for bit where this CPU gives the fixture's epoch-2 state; elsewhere the
    # resumed third epoch must still land where the straight one does.
    two_epochs = make.build()
    two_epochs.fit(x, y, batch_size=8, epochs=2, verbose=0,
                   checkpoint_dir=str(tmp_path / "two"))
    expected = dict(np.load(os.path.join(FIXTURES, "expected.npz")))
    same_rounding = all(np.array_equal(v, expected[k])
                        for k, v in make.values(two_epochs).items())
    assert_same(make.values(resumed), make.values(straight), exact=same_rounding)


def test_user_checkpoint_written_before_the_split_reads_into_a_fresh_trainer():
    expected = dict(np.load(os.path.join(FIXTURES, "expected.npz")))
    trainer = make.build()
    x, y = make.data()
    trainer.build_state(x, y, batch_size=8)
    trainer.checkpoint.read(os.path.join(FIXTURES, "user", "ckpt")) \
        .assert_existing_objects_matched()
    assert_same(make.values(trainer), expected)
