"""Every bench report records the CPU beside its figures."""

from tapeworks import machine
from tapeworks.bench import harness


def test_a_report_names_the_cpu_and_its_speed_flags():
    described = harness.machine_description()
    assert set(described["cpu_flags"]) <= set(machine.SPEED_FLAGS)
    assert described["cpu"] == machine.cpu_model_name()
    result = {"scenario": "x", "columns": [("model", "model")], "rows": [],
              "machine": described, "when": "now", "repeats_per_approach": 1}
    first = harness.to_markdown(result).splitlines()[2]
    assert f"; CPU flags: {' '.join(described['cpu_flags'])}" in first or \
        "none of avx2" in first
    assert described["cpu"] in first
