"""The `tapeworks` command line: one entry point, one sub-command per verb."""

import argparse
import importlib.metadata
import json
import os
import sys
import tempfile

import tapeworks
from tapeworks.demo import command as demo_command


def _quiet_tensorflow():
    """Imports TensorFlow without its C++ start-up lines (oneDNN, cudart_stub, cuInit).

    Those lines are written straight to file descriptor 2 before TensorFlow's
    logging is set up, so TF_CPP_MIN_LOG_LEVEL does not reach them. The CLI
    imports TensorFlow (and lists its devices, which prints the CUDA lines)
    with descriptor 2 sent to a temporary file, and shows that file only if
    the import fails. Verbs that do not need TensorFlow (lint) skip this.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _version():
    def installed(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return (f"tapeworks {tapeworks.__version__} (TensorFlow {installed('tensorflow')}, "
            f"Keras {installed('keras')})")


def _demo(args):
    _quiet_tensorflow()
    return demo_command.main(args)


def _bench(args):
    # Listing, refusing a name and redrawing start no TensorFlow.
    from tapeworks.bench import charts, scenarios

    described = scenarios.descriptions()
    unknown = [n for n in args.scenarios if n not in described]
    if unknown:
        print(f"tapeworks bench: unknown scenario(s) {', '.join(unknown)}. Expected one of: "
              f"{', '.join(sorted(described))}. Fix: see `tapeworks bench --list`.",
              file=sys.stderr)
        return 2
    if args.list:
        for name, description in described.items():
            print(f"{name:12s} {description}")
        return 0
    if args.redraw:
        written = charts.redraw(args.redraw)
        if not written:
            print(f"tapeworks bench --redraw: no benchmark report (*.json with a chart) in "
                  f"{args.redraw!r}. Expected a folder `tapeworks bench --out` wrote. Fix: "
                  "name that folder.", file=sys.stderr)
            return 2
        print(f"Drew {', '.join(written)}")
        return 0
    _quiet_tensorflow()
    from tapeworks.bench import harness

    names = args.scenarios or list(harness.SCENARIOS)
    command = "tapeworks bench " + " ".join(sys.argv[2:])
    for name in names:
        report = harness.run_scenario(name, quick=args.quick, repeats=args.repeats,
                                      out_dir=args.out, command=command.strip())
        print(report["markdown"])
        print(f"Wrote {', '.join(report['files'])}\n")
    return 0


def _lint(args):
    from tapeworks.lint import runner
    from tapeworks.lint.rules import RULES

    if args.list:
        for code, rule in RULES.items():
            print(f"{code}  {rule.name:32s} {rule.summary}")
        return 0
    if args.explain:
        rule = RULES.get(args.explain.upper())
        if rule is None:
            print(f"tapeworks lint: unknown rule {args.explain!r}. Expected one of "
                  f"{', '.join(RULES)}.", file=sys.stderr)
            return 2
        print(rule.explain())
        return 0
    if not args.paths:
        print("tapeworks lint: no paths given. Expected files or folders to check, e.g. "
              "`tapeworks lint src/`.", file=sys.stderr)
        return 2
    try:
        pyproject = args.config or runner.find_pyproject(args.paths[0])
        config = runner.Config.from_pyproject(pyproject) if pyproject else runner.Config()
        select = tuple(c for c in (args.select or "").split(",") if c)
        ignore = tuple(c for c in (args.ignore or "").split(",") if c)
        runner.validate_codes(select + ignore)
        if select:
            config.select = select
        config.ignore = config.ignore + ignore
        findings, files = runner.lint_paths(args.paths, config)
    except runner.LintUsageError as error:
        print(f"tapeworks lint: {error}", file=sys.stderr)
        return 2
    output = runner.format_findings(findings, args.format, files)
    if output:
        print(output)
    if args.format == "text":
        print(f"{len(findings)} finding(s) in {files} file(s).", file=sys.stderr)
    return 1 if findings else 0


def _doctor(args):
    import time

    from tapeworks import doctor

    # The import is the smoke check's first step: timed here, where it happens.
    start = time.perf_counter()
    try:
        _quiet_tensorflow()
    except Exception as error:  # noqa: BLE001 - the doctor reports a broken install
        return doctor.main(as_json=args.json, quick=args.quick, import_error=error)
    return doctor.main(as_json=args.json, quick=args.quick,
                       import_seconds=time.perf_counter() - start)


def _explain(args):
    from tapeworks import explain

    _quiet_tensorflow()
    return explain.run(args)


def _cache(args):
    # The cache is plain files: no TensorFlow import needed.
    from tapeworks import xla_cache
    from tapeworks.engine.plan import plan_cache

    cache = plan_cache.PlanCache()
    if args.action == "clear":
        removed = cache.clear()
        executables = xla_cache.clear()
        print(f"Removed {removed} plan{'s' if removed != 1 else ''} from {cache.folder} and "
              f"{executables} XLA executable{'s' if executables != 1 else ''} from "
              f"{xla_cache.root()}.")
        return 0
    entries = cache.entries()
    if args.json:
        print(json.dumps([dict(plan, key=key) for key, plan in entries], indent=1))
        return 0
    compiled = xla_cache.entries()
    print(f"{len(compiled)} XLA executable{'s' if len(compiled) != 1 else ''} "
          f"({sum(size for _, size in compiled) / 2**20:.1f} MiB) in {xla_cache.root()}"
          f"{'' if xla_cache.enabled_by_environment() else ' (off: TAPEWORKS_XLA_CACHE=0)'}")
    print(f"{len(entries)} plan{'s' if len(entries) != 1 else ''} in {cache.folder}"
          f"{'' if plan_cache.enabled_by_environment() else ' (off: TAPEWORKS_PLAN_CACHE=0)'}")
    for key, plan in entries:
        what = plan.get("what", {})
        print(f"{key}  jit_compile={plan['jit_compile']}, steps_per_call={plan['steps_per_call']}"
              f"  models={what.get('models')} batch={what.get('batch')} "
              f"precision={what.get('precision')}  {plan.get('created', '')}")
        print(f"    {plan.get('reason', '')}")
        memory = plan.get("memory")
        if isinstance(memory, dict) and memory.get("waiting"):
            waiting = ", ".join({True: "XLA", "update": "XLA update"}.get(m, str(m))
                                for m in memory["waiting"])
            print(f"    not tried yet: {waiting} (after {memory.get('steps_seen', '?')} steps "
                  "trained with this plan; tried once the runs together can repay it)")
    return 0


def _export(args):
    _quiet_tensorflow()
    import keras

    from tapeworks import TapeworksError, deploy

    try:
        model = keras.saving.load_model(args.model, safe_mode=True)
        report = deploy.export(model, args.path, format=args.format, quantize=args.quantize,
                               overwrite=args.overwrite)
    except (TapeworksError, ValueError, OSError) as error:
        # Keras' own load errors (a missing file, an unregistered class, an
        # unsafe Lambda) are ValueErrors and OSErrors with their reason.
        print(f"tapeworks export: {error}", file=sys.stderr)
        return 1
    print(report)
    return 0


def _serve(args):
    _quiet_tensorflow()
    from tapeworks.serve import server

    return server.run(args)


def _registry(args):
    from tapeworks.deploy.registry import Registry, RegistryError

    registry = Registry(args.root)
    try:
        if args.action == "publish":
            _quiet_tensorflow()
            metrics = json.loads(args.metrics) if args.metrics else None
            info = registry.publish(args.name, args.path, label=args.label, metrics=metrics,
                                    checkpoint=args.checkpoint, promote=args.promote)
            print(f"published {info.name} version {info.version}"
                  + (f" ({info.label})" if info.label else "")
                  + (" and made it current" if args.promote else "")
                  + f": {info.path} (sha256 {info.sha256[:12]})")
        elif args.action == "list":
            rows = [{"name": n, "current": registry.current(n),
                     "versions": [v.version for v in registry.versions(n)]}
                    for n in registry.models()]
            if args.json:
                print(json.dumps(rows, indent=1))
            for row in [] if args.json else rows:
                print(f"{row['name']}: current {row['current']}, versions {row['versions']}")
            if not rows and not args.json:
                print(f"no models in {registry.root}")
        elif args.action == "show":
            info = registry.show(args.name, args.version)
            print(json.dumps(dict(info.to_json(), version=info.version, path=info.path,
                                  current=registry.current(args.name) == info.version),
                             indent=1))
        elif args.action == "promote":
            before = registry.promote(args.name, args.version)
            print(f"{args.name}: current {before} -> {args.version}")
        elif args.action == "rollback":
            before = registry.current(args.name)
            after = registry.rollback(args.name)
            print(f"{args.name}: current {before} -> {after} (rolled back)")
        elif args.action == "history":
            for event in registry.history(args.name):
                print(json.dumps(event))
        elif args.action == "gc":
            removed = registry.gc(args.name, args.keep)
            print(f"{args.name}: removed versions {removed or 'none'}")
    except (RegistryError, ValueError) as error:
        print(f"tapeworks registry {args.action}: {error}", file=sys.stderr)
        return 1
    return 0


def _launch(args):
    # No TensorFlow here: the workers import it, the launcher only starts them.
    from tapeworks import launch

    return launch.main(args)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="tapeworks",
        description="Fast, correct and debuggable training for TensorFlow 2 / Keras 3.",
    )
    parser.add_argument("--version", action="version", version=_version())
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    demo = verbs.add_parser(
        "demo", help="train a x2 super-resolution network on bundled photographs",
        description="Train a small x2 super-resolution network on scikit-image's bundled "
                    "photographs (no downloads), report PSNR against bicubic on the held-out "
                    "astronaut, and write a side-by-side PNG and TensorBoard logs.")
    demo_command.add_arguments(demo)
    demo.set_defaults(run=_demo)

    bench = verbs.add_parser(
        "bench", help="run benchmark scenarios (ratios measured in one run)",
        description="Run named benchmark scenarios. Each compares approaches on the same model "
                    "and data in one process, alternating approaches, and reports the median of "
                    "timed repeats after a warm-up, as Markdown, JSON and a PNG chart.")
    bench.add_argument("scenarios", nargs="*", help="scenario names (default: all)")
    bench.add_argument("--list", action="store_true", help="list the scenarios")
    bench.add_argument("--quick", action="store_true", help="tiny sizes, for a CI smoke run")
    bench.add_argument("--repeats", type=int, default=5,
                       help="timed repeats per approach, >= 3 (default: %(default)s)")
    bench.add_argument("--out", default="bench-results", help="output folder (default: %(default)s)")
    bench.add_argument("--redraw", metavar="FOLDER",
                       help="draw the charts of a results folder again from its JSON reports "
                            "(the figures stay; only the pictures change), run nothing")
    bench.set_defaults(run=_bench)

    lint = verbs.add_parser(
        "lint", help="check Python files for TensorFlow training anti-patterns",
        description="Statically check Python files (nothing is imported or run) for "
                    "TensorFlow training anti-patterns. Exit status: 0 clean, 1 findings, "
                    "2 usage error. `# noqa: CODE` silences a line; [tool.tapeworks.lint] "
                    "in pyproject.toml takes select, ignore and exclude lists.")
    lint.add_argument("paths", nargs="*", help="files or folders")
    lint.add_argument("--format", choices=("text", "json"), default="text")
    lint.add_argument("--select", help="comma-separated codes or prefixes to report only")
    lint.add_argument("--ignore", help="comma-separated codes or prefixes to leave out")
    lint.add_argument("--config", help="pyproject.toml to read (default: the nearest one)")
    lint.add_argument("--explain", metavar="CODE", help="explain a rule, with examples")
    lint.add_argument("--list", action="store_true", help="list the rules")
    lint.set_defaults(run=_lint)

    cache = verbs.add_parser(
        "cache", help="show or clear the plans \"auto\" stored and the XLA executables",
        description="Show or clear the plan cache: what \"auto\" chose for each fingerprint "
                    "(models, batch, precision, optimizer, device, versions), kept so that "
                    "the next run of the same script measures nothing, and the XLA "
                    "executables TensorFlow saved for later runs on this CPU. Location: "
                    "$TAPEWORKS_CACHE_DIR/plans and .../xla, by default under "
                    "~/.cache/tapeworks; TAPEWORKS_PLAN_CACHE=0 and TAPEWORKS_XLA_CACHE=0 "
                    "turn them off. --json lists the plans.")
    cache.add_argument("action", choices=("show", "clear"))
    cache.add_argument("--json", action="store_true", help="show as JSON")
    cache.set_defaults(run=_cache)

    doctor = verbs.add_parser(
        "doctor", help="check this machine: versions, driver, CUDA, GPUs, XLA, a smoke run",
        description="Check that this machine can train: Python/TensorFlow/Keras versions "
                    "against the support table, TensorFlow's CUDA/cuDNN build against the "
                    "driver and the libraries found, the GPUs (compute capability, memory, "
                    "what precision=\"auto\" picks), CPU features, GPU memory mode, XLA, then "
                    "a timed smoke check. Exit status 1 when a check fails.")
    doctor.add_argument("--json", action="store_true",
                        help="print the report as JSON (schema tapeworks.doctor/1)")
    doctor.add_argument("--quick", action="store_true", help="skip the smoke training")
    doctor.set_defaults(run=_doctor)

    from tapeworks import explain

    explain_verb = verbs.add_parser(
        "explain", help="where a step's time goes and what would help (module:function)",
        description=explain.DESCRIPTION + " The function takes no arguments and returns "
                                          "(trainer, data).")
    explain.add_arguments(explain_verb)
    explain_verb.set_defaults(run=_explain)

    export = verbs.add_parser(
        "export", help="write a .keras model as a verified SavedModel, .keras or LiteRT artefact",
        description="Load MODEL (a .keras archive, with safe_mode=True), write it to PATH in "
                    "FORMAT, load the artefact in a fresh process and check that it gives the "
                    "model's outputs; print its size, load time and latency. A failed check "
                    "leaves nothing at PATH (exit status 1). For preprocessing inside the "
                    "signature, use tapeworks.deploy.export from Python.")
    export.add_argument("model", help="the .keras archive to export")
    export.add_argument("path", help="where the artefact goes (a folder for saved_model)")
    export.add_argument("--format", choices=["saved_model", "keras", "tflite"],
                        default="saved_model", help="default: %(default)s (what TF Serving loads)")
    export.add_argument("--quantize", choices=["dynamic", "float16"], default=None,
                        help="tflite only: int8 weights (dynamic) or float16 weights; full int8 "
                             "needs calibration data: tapeworks.deploy.export from Python")
    export.add_argument("--overwrite", action="store_true",
                        help="replace an artefact at PATH once the new one is verified")
    export.set_defaults(run=_export)

    serve = verbs.add_parser(
        "serve", help="serve SavedModels over TensorFlow Serving's REST (and gRPC) API (hot "
                      "reload, dynamic batching)",
        description="Serve a tapeworks registry (or a folder of TF Serving model folders, or "
                    "TF Serving's --model_base_path / --model_config_file) over TensorFlow "
                    "Serving's REST API (and its gRPC API with --grpc-port), with hot reload "
                    "when `current` moves and dynamic batching across concurrent requests. TF "
                    "Serving's flags are accepted.")
    from tapeworks.serve import server as serve_server

    serve_server.add_arguments(serve)
    serve.set_defaults(run=_serve)

    registry = verbs.add_parser(
        "registry", help="publish, promote and roll back model versions (TF Serving's layout)",
        description="A versioned registry of SavedModels in TensorFlow Serving's layout "
                    "(ROOT/NAME/VERSION/), with atomic publish, promote, rollback and gc, and "
                    "a models.config that pins each model's current version for a real TF "
                    "Serving. The root is --root, or $TAPEWORKS_REGISTRY, or ./models.")
    registry.add_argument("--root", default=os.environ.get("TAPEWORKS_REGISTRY", "models"),
                          help="the registry folder (default: $TAPEWORKS_REGISTRY or ./models)")
    actions = registry.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    publish = actions.add_parser("publish", help="copy a SavedModel in as the next version")
    publish.add_argument("name")
    publish.add_argument("path", help="a SavedModel folder (tapeworks export writes one), or a "
                                      ".keras file (exported and verified first)")
    publish.add_argument("--label", help="a human label, e.g. v1.2")
    publish.add_argument("--metrics", help="training metrics as JSON, e.g. '{\"accuracy\": 0.95}'")
    publish.add_argument("--checkpoint", help="the checkpoint it came from")
    publish.add_argument("--promote", action="store_true", help="also make it current")
    listing = actions.add_parser("list", help="models, their versions and current version")
    listing.add_argument("--json", action="store_true")
    show = actions.add_parser("show", help="one version's metadata (default: current)")
    show.add_argument("name")
    show.add_argument("version", nargs="?", type=int)
    promote = actions.add_parser("promote", help="make a version current")
    promote.add_argument("name")
    promote.add_argument("version", type=int)
    rollback = actions.add_parser("rollback", help="back to the previous current version")
    rollback.add_argument("name")
    history = actions.add_parser("history", help="publishes, promotions and rollbacks")
    history.add_argument("name")
    gc = actions.add_parser("gc", help="remove old versions (never current or previous)")
    gc.add_argument("name")
    gc.add_argument("--keep", type=int, required=True, help="newest versions to keep")
    registry.set_defaults(run=_registry)

    launch = verbs.add_parser(
        "launch", help="run N local workers of a multi-worker script, each with its TF_CONFIG",
        description="Start the command N times on this machine, worker i with a TF_CONFIG "
                    "naming N free loopback ports and index i (what "
                    "tf.distribute.MultiWorkerMirroredStrategy reads), stream their output "
                    "with a [worker i] prefix, pass SIGTERM/SIGINT on to all, and stop them "
                    "all when one fails (exit status: that worker's). For development and "
                    "tests; on a cluster its scheduler sets TF_CONFIG.",
        usage="tapeworks launch [-h] --workers N [--grace SECONDS] [--] command ...")
    launch.add_argument("--workers", type=int, required=True, metavar="N",
                        help="how many worker processes")
    launch.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                        help="after a failure, seconds the others get to exit on SIGTERM "
                             "before SIGKILL (default: %(default)s)")
    launch.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command each worker runs, e.g. python train.py")
    launch.set_defaults(run=_launch)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.verb == "bench" and args.repeats < 3:
        print(f"tapeworks bench: --repeats must be >= 3 (medians of fewer are noise). "
              f"Received: --repeats {args.repeats}", file=sys.stderr)
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
