"""`tapeworks doctor`: is this machine ready to train, and if not, what exactly to fix.

Each check passes, warns or fails, says what it found and the fix: versions
against the support table (`support.json`), TensorFlow's build against the
driver and the CUDA/cuDNN libraries the machine has, the GPUs and what their
compute capability means for `precision="auto"`, CPU features, GPU memory
mode, XLA, then a timed smoke check (import, devices, a matmul on each
device, a gradient, a 5-step `Trainer.fit`; `quick` skips the fit).

JSON schema (`--json`), version 1:

    {"schema": "tapeworks.doctor/1",
     "tapeworks": "<version>",
     "ok": true | false,                 # no check failed
     "summary": {"pass": n, "warn": n, "fail": n},
     "checks": [{"id": "<stable id>", "title": "...", "status": "pass"|"warn"|"fail",
                 "found": "...", "fix": "..." (may be ""), "seconds": float | null}],
     "notes": ["why a fact is missing (a tool not installed, hung, failed)"]}

Check ids: python, tensorflow, keras, nvidia_driver, cuda_libraries, gpus,
gpu0..gpuN, cpu, gpu_memory, smoke_import, smoke_devices, smoke_matmul,
smoke_gradient, xla, smoke_fit (ids that do not apply to a machine are absent).
"""

import dataclasses
import json

from tapeworks.doctor import checks as checks_lib
from tapeworks.doctor import facts as facts_lib
from tapeworks.doctor import smoke

SCHEMA = "tapeworks.doctor/1"


@dataclasses.dataclass
class Report:
    checks: list
    notes: list

    @property
    def ok(self):
        return not any(c.status == checks_lib.FAIL for c in self.checks)

    def summary(self):
        return {status: sum(c.status == status for c in self.checks)
                for status in (checks_lib.PASS, checks_lib.WARN, checks_lib.FAIL)}

    def to_json(self):
        from tapeworks import __version__

        return {"schema": SCHEMA, "tapeworks": __version__, "ok": self.ok,
                "summary": self.summary(),
                "checks": [dataclasses.asdict(c) for c in self.checks],
                "notes": list(self.notes)}

    def text(self):
        lines = ["tapeworks doctor"]
        for check in self.checks:
            seconds = f" ({check.seconds:.2f} s)" if check.seconds is not None else ""
            lines.append(f"  {check.status.upper():4}  {check.title}: {check.found}{seconds}")
            if check.fix and check.status != checks_lib.PASS:
                lines.append(f"        fix: {check.fix}")
            elif check.fix:
                lines.append(f"        note: {check.fix}")
        summary = self.summary()
        lines.append(f"{summary['pass']} passed, {summary['warn']} warning(s), "
                     f"{summary['fail']} failed")
        return "\n".join(lines)


def diagnose(facts, quick=False, smoke_checks=True, import_seconds=None, import_error=None):
    """The report for `facts` (and, with `smoke_checks`, this process's smoke checks)."""
    found = checks_lib.all_checks(facts)
    if smoke_checks:
        found += smoke.run(quick=quick, import_seconds=import_seconds,
                           import_error=import_error)
    return Report(found, list(facts.notes))


def run(quick=False, import_seconds=None, import_error=None):
    """Gathers this machine's facts and checks them."""
    facts = facts_lib.gather(with_tensorflow=import_error is None, probe_onednn=not quick)
    return diagnose(facts, quick=quick, import_seconds=import_seconds,
                    import_error=import_error)


def main(as_json=False, quick=False, import_seconds=None, import_error=None):
    """The CLI: prints the report; returns the exit code (1 when a check failed)."""
    report = run(quick=quick, import_seconds=import_seconds, import_error=import_error)
    print(json.dumps(report.to_json(), indent=2) if as_json else report.text())
    return 0 if report.ok else 1
