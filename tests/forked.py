"""Fresh processes for tests that start many short ones, without paying the imports each time.

The resume tests kill and restart a worker a dozen times per case; in a new
interpreter each start spends ~10 s importing TensorFlow and Keras (on this
2-core machine, under the suite's load) for a second of training. Here the
processes are forked from a `multiprocessing` forkserver that imported
TensorFlow, Keras and tapeworks once. No TensorFlow op has run in the
forkserver, so no TensorFlow runtime, thread pool or device exists there yet:
each child builds its own, as a fresh interpreter would. Each child is a
real process: its own pid, SIGKILL ends it with exit code -9, a signal
handler it installs is its own.
"""

import multiprocessing
import os

# What the forkserver imports once (an ImportError there is ignored by
# multiprocessing; the child then imports the module itself).
PRELOAD = ["tensorflow", "keras", "tapeworks", "tapeworks.engine", "tests.forked"]

_context = None


def _forkserver():
    global _context
    if _context is None:
        # Read by TensorFlow's C++ logging when it is imported: the forkserver's
        # import must see it.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _run_child(function, args, env, stdout, stderr):
    for name, value in env.items():   # None: unset
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    for fd, path in ((1, stdout), (2, stderr)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(file, fd)
        os.close(file)
    function(*args)


class Forked:
    """`function(*args)` in a started child, its environment updated by `env` (None unsets).

    `pid`; `wait(timeout)` -> (exit code, stdout, stderr); the output goes to
    `out_prefix`.stdout and .stderr.
    """

    def __init__(self, function, args, env, out_prefix):
        self.stdout, self.stderr = f"{out_prefix}.stdout", f"{out_prefix}.stderr"
        context = _forkserver()
        self.process = context.Process(target=_run_child,
                                       args=(function, args, dict(env), self.stdout,
                                             self.stderr))
        self.process.start()
        self.pid = self.process.pid

    def wait(self, timeout):
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(30)
            raise AssertionError(f"the forked process did not finish in {timeout} s: "
                                 f"{self._read(self.stderr)[-3000:]}")
        return self.process.exitcode, self._read(self.stdout), self._read(self.stderr)

    @staticmethod
    def _read(path):
        try:
            with open(path) as file:
                return file.read()
        except FileNotFoundError:
            return ""
