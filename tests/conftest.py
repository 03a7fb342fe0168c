import os

# Quiet TensorFlow's C++ start-up logging in test output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Tests measure "auto" from scratch: plans stored by one test (or an earlier
# run on this machine) must not decide another's. The plan cache's own tests
# pass a folder explicitly.
os.environ["TAPEWORKS_PLAN_CACHE"] = "0"
# Likewise XLA's executables: a test that compiles must pay the compile (and
# nothing is written to the user's home). Set before tapeworks is imported.
os.environ["TAPEWORKS_XLA_CACHE"] = "0"
