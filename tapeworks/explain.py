"""The command line of `Trainer.explain`: `python -m tapeworks.explain` and `tapeworks explain`.

`python -m tapeworks.explain package.module:function [--steps N] [--profile DIR]
[--json]` calls `function()`, which returns `(trainer, data)` (or a dict
with those keys), and prints the explanation (`tapeworks.engine.explanation`:
where a training step's time goes, and what would help on this machine);
`--profile DIR` also writes a TensorBoard profiler trace of a few steps to DIR.
This module imports TensorFlow only when it runs: the CLI imports it to
build its --help.
"""

import argparse
import json
import os
import sys
import importlib

DESCRIPTION = ("Where a training step's time goes (input, compute, host, compiling) and "
               "which changes would help on this machine, measured. Trains nothing.")


# The command line ---------------------------------------------------------------

def load(target):
    """`package.module:function` -> (trainer, data) from calling that function."""
    from tapeworks.errors import ConfigError

    module_name, _, function_name = target.partition(":")
    if not module_name or not function_name:
        raise ConfigError(
            f"Expected `module:function`, e.g. `myproject.train:make`. Received: {target!r}. "
            "The function takes no arguments and returns (trainer, data) or "
            "{'trainer': ..., 'data': ...}.")
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"`{module_name}` has no function `{function_name}`. Expected a "
                          "function returning (trainer, data).")
    made = function()
    if isinstance(made, dict):
        made = (made.get("trainer"), made.get("data"))
    from tapeworks.engine.trainer import Trainer

    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], Trainer)):
        raise ConfigError(f"`{target}` returned {type(made).__name__}. Expected (trainer, data) "
                          "with a tapeworks.Trainer first.")
    return made


def add_arguments(parser):
    """The arguments of `python -m tapeworks.explain` and `tapeworks explain`."""
    parser.add_argument("target", help="module:function returning (trainer, data)")
    parser.add_argument("--steps", type=int, default=20, help="steps per measurement")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="batch size, for data that is not batched yet")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="also write a TensorBoard profiler trace of a few steps here")
    parser.add_argument("--no-xla", action="store_true", help="do not try XLA modes")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args):
    from tapeworks.errors import TapeworksError

    try:
        trainer, data = load(args.target)
        result = trainer.explain(data, steps=args.steps, batch_size=args.batch_size,
                                 profile_dir=args.profile, try_xla=not args.no_xla)
    except TapeworksError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2, default=str) if args.json else result)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tapeworks.explain", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
