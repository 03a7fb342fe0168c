"""`tapeworks demo`: its arguments, what it prints before and after training.

Kept beside the demo, so `cli.py` only names the verb.
"""

import json
import time

DEFAULT_SECONDS = 75.0
DEFAULT_EPOCHS = 4


def add_arguments(parser):
    """Declares the demo's command-line arguments on `parser` (an argparse parser)."""
    parser.add_argument("--out", default="tapeworks-demo",
                        help="output folder (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=None, metavar="S",
                        help=f"train for S seconds (default: {DEFAULT_SECONDS:.0f} s or "
                             f"{DEFAULT_EPOCHS} epochs, whichever comes first; given alone, "
                             "no epoch limit)")
    parser.add_argument("--epochs", type=int, default=None, metavar="N",
                        help="train N epochs (given alone, no time limit; with --seconds, "
                             "whichever comes first)")
    parser.add_argument("--quick", action="store_true", help="a few seconds' run, for tests")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--perceptual", type=float, nargs="?", const=0.01, default=None,
                        metavar="WEIGHT",
                        help="add a frozen critic's perceptual loss with this weight "
                             "(default weight when given alone: %(const)s)")


def length(args):
    """(epochs, seconds) the arguments ask for; None means no limit of that kind.

    Neither given: the default budget (75 s or 4 epochs, whichever first).
    One given: that one alone, so `--seconds 600` is not cut short by the
    default's 4 epochs, nor `--epochs 20` by its 75 s.
    """
    if args.epochs is not None and args.epochs < 1:
        raise SystemExit(f"tapeworks demo: `--epochs` must be an integer >= 1. Received: "
                         f"--epochs {args.epochs}.")
    if args.seconds is not None and args.seconds <= 0:
        raise SystemExit(f"tapeworks demo: `--seconds` must be a number > 0. Received: "
                         f"--seconds {args.seconds:g}.")
    if args.epochs is None and args.seconds is None:
        return DEFAULT_EPOCHS, DEFAULT_SECONDS
    return args.epochs, args.seconds


def describe_length(epochs, seconds):
    if epochs is not None and seconds is not None:
        return f"{seconds:g} s or {epochs} epoch(s), whichever comes first"
    if seconds is not None:
        return f"{seconds:g} s"
    return f"{epochs} epoch(s)"


def main(args):
    """Runs the demo as the arguments say and prints what it found. Returns the exit status."""
    import dataclasses

    from tapeworks import machine
    from tapeworks.demo import superres

    config = superres.DemoConfig.quick() if args.quick else superres.DemoConfig()
    if not args.quick or args.epochs is not None or args.seconds is not None:
        epochs, seconds = length(args)
        config = dataclasses.replace(config, epochs=epochs, seconds=seconds)
    print(f"This machine: {machine.gather().describe()}")
    print(f"Training a x{superres.SCALE} super-resolution network for "
          f"{describe_length(config.epochs, config.seconds)} (ask for more with --seconds or "
          f"--epochs), then evaluating it on the held-out {superres.HELD_OUT}.", flush=True)
    result = superres.run(out_dir=args.out, verbose=0 if args.quiet else "auto",
                          config=config, perceptual=args.perceptual)
    tuning = result["tuning"]
    print(f"\nHeld-out image ({superres.HELD_OUT}), PSNR on luminance, x{superres.SCALE}:")
    print(f"  bicubic  {result['psnr_bicubic']:6.2f} dB")
    print(f"  network  {result['psnr_network']:6.2f} dB  ({result['gain_db']:+.2f} dB)")
    if tuning["jit_compile"] is None:
        chose = "tapeworks was still measuring its execution mode (the run was short)"
    else:
        chose = (f"tapeworks chose jit_compile={tuning['jit_compile']}, "
                 f"steps_per_call={tuning['steps_per_call']} ({tuning['reason']})")
    print(f"Trained {result['steps']} steps ({result['epochs']:.2f} epochs) in "
          f"{result['train_seconds']:.1f} s ({result['total_seconds']:.1f} s in all, "
          f"{seconds_since_start():.0f} s since the command started); precision "
          f"{result['precision']} ({result['precision_reason']}); {chose}.")
    print(f"Wrote {result['png']} and TensorBoard logs in {result['logs']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
    return 0


def seconds_since_start():
    """Seconds since this process started: imports included, as a user's stopwatch sees it."""
    import psutil

    return time.time() - psutil.Process().create_time()
