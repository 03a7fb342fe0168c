"""`tapeworks lint` and the flake8 plugin, run as real processes on real files."""

import json
import subprocess
import sys
import textwrap

import pytest

BAD = textwrap.dedent("""\
    import tensorflow as tf

    @tf.function
    def step(x):
        print(x)
        return x
""")
CLEAN = "import tensorflow as tf\n\n\ndef f(x):\n    return tf.print(x)\n"


def lint(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tapeworks.cli", "lint", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "bad.py").write_text(BAD)
    (tmp_path / "pkg" / "clean.py").write_text(CLEAN)
    return tmp_path


def test_findings_exit_1_with_flake8_style_lines(project):
    result = lint("pkg", cwd=project)
    assert result.returncode == 1
    assert result.stdout.strip() == (
        "pkg/bad.py:5:5: TW103 `print()` inside a tf.function runs once, while tracing "
        "(see docs: lint-rules#TW103)")


def test_clean_exits_0(project):
    result = lint("pkg/clean.py", cwd=project)
    assert result.returncode == 0 and result.stdout == ""


def test_json_output(project):
    result = lint("--format", "json", "pkg", cwd=project)
    report = json.loads(result.stdout)
    assert result.returncode == 1
    assert report["files"] == 2
    assert report["findings"] == [{"path": "pkg/bad.py", "line": 5, "col": 5, "code": "TW103",
                                   "message": "`print()` inside a tf.function runs once, "
                                              "while tracing"}]


@pytest.mark.parametrize("args, message", [
    (["nowhere.py"], "No such file or folder"),
    (["--select", "XX9", "pkg"], "Unknown rule code 'XX9'"),
    ([], "no paths given"),
    (["--explain", "TW999"], "unknown rule"),
])
def test_usage_errors_exit_2(project, args, message):
    result = lint(*args, cwd=project)
    assert result.returncode == 2 and message in result.stderr


def test_pyproject_config(project):
    (project / "pyproject.toml").write_text('[tool.tapeworks.lint]\nignore = ["TW103"]\n')
    assert lint("pkg", cwd=project).returncode == 0
    (project / "pyproject.toml").write_text('[tool.tapeworks.lint]\nexclude = ["bad.py"]\n')
    assert lint("pkg", cwd=project).returncode == 0
    (project / "pyproject.toml").write_text('[tool.tapeworks.lint]\nselect = ["TW101"]\n')
    assert lint("pkg", cwd=project).returncode == 0
    (project / "pyproject.toml").write_text('[tool.tapeworks.lint]\nselct = ["TW101"]\n')
    result = lint("pkg", cwd=project)
    assert result.returncode == 2 and "unknown key(s)" in result.stderr


def test_explain_and_list():
    result = lint("--explain", "tw106")
    assert result.returncode == 0
    assert "Bad:" in result.stdout and "Good:" in result.stdout and "Fix:" in result.stdout
    listed = lint("--list").stdout.splitlines()
    assert [line.split()[0] for line in listed] == [f"TW1{i:02d}" for i in range(1, 14)]
    assert not any("{" in line for line in listed)   # no raw message templates


def test_flake8_plugin(project):
    result = subprocess.run([sys.executable, "-m", "flake8", "--select", "TW", "pkg"],
                            capture_output=True, text=True, cwd=project, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stdout.strip() == (
        "pkg/bad.py:5:5: TW103 `print()` inside a tf.function runs once, while tracing "
        "(see docs: lint-rules#TW103)")


def test_flake8_honours_noqa(project):
    (project / "pkg" / "bad.py").write_text(BAD.replace("print(x)", "print(x)  # noqa: TW103"))
    result = subprocess.run([sys.executable, "-m", "flake8", "--select", "TW", "pkg"],
                            capture_output=True, text=True, cwd=project, timeout=120)
    assert result.returncode == 0 and result.stdout == ""


@pytest.mark.parametrize("terms, what", [(100_000, "could not parse"),
                                         (1_000, "could not check")])
def test_a_file_nested_too_deeply_is_a_finding_and_the_others_are_still_checked(
        tmp_path, terms, what):
    deep = tmp_path / "generated.py"
    deep.write_text("import tensorflow as tf\n\n\n@tf.function\ndef f(x):\n    return "
                    + "+".join(["x"] * terms) + "\n")
    (tmp_path / "step.py").write_text(BAD)
    result = lint(str(tmp_path))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith(f"{deep}:1:1: TW000 {what}: the code nests too deeply")
               for line in lines), result.stdout
    assert any(f"{tmp_path / 'step.py'}:5:5: TW103" in line for line in lines)


def test_the_flake8_plugin_reports_a_tree_too_deep_for_the_rules(tmp_path):
    from tapeworks.lint.flake8_plugin import TapeworksLint
    import ast

    tree = ast.parse("import tensorflow as tf\n\n\n@tf.function\ndef f(x):\n    return "
                     + "+".join(["x"] * 1_000) + "\n")
    [(line, col, message, _)] = list(TapeworksLint(tree, "generated.py").run())
    assert (line, col) == (1, 0) and message.startswith("TW000 could not check")
