"""The CLI given bad arguments a user types (hunt h13): each is a typed error, its layer's exit code,
one line on stderr and no traceback; never exit 0 with a dropped argument.

Before the fixes:
- stdout that cannot be written (``> /dev/full``) ended in a traceback (``--json``: two), exit 1; a closed
  stdout (``>&-``) in ``AttributeError``, exit 1 after printing nothing;
- ``score --max-error-rate nan`` passed click's range and never failed (exit 0 at any error rate);
- ``serve --drain-timeout nan|inf`` crashed (``ValueError``/``OverflowError``, exit 1), ``--read-timeout nan``
  and ``--batch-delay-ms nan`` were taken, ``--port -1|70000`` was ``OverflowError`` from ``bind()``, exit 1;
- an option taking one value given twice with different values (``--text good --text bad``, ``-o a -o b``,
  ``--letterbox --stretch``) kept the last silently, and so did ``--limit KEY=...`` given twice for one key.
"""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from edge_runtime.cli import main


def run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def one_error_line(stderr: str, code: str):
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error [{code}]"), stderr
    assert "Traceback" not in stderr


def shell(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", f"exec {sys.executable} -m edge_runtime {cmd}"], capture_output=True,
                          text=True, timeout=60)


# -- stdout that cannot be written -----------------------------------------------------------------

@pytest.mark.parametrize("args", ["devices --json", "devices"])
def test_a_full_stdout_is_a_typed_error_not_a_traceback(args):
    proc = shell(f"{args} > /dev/full")
    assert proc.returncode == 2, proc.stderr
    one_error_line(proc.stderr, "input_invalid")
    assert "<stdout>" in proc.stderr and "No space left" in proc.stderr


def test_a_closed_stdout_is_a_typed_error_not_exit_0_or_an_attribute_error():
    proc = shell("devices >&-")
    assert proc.returncode == 2, proc.stderr
    one_error_line(proc.stderr, "input_invalid")


def test_an_error_under_json_with_a_full_stdout_keeps_its_own_code(tmp_path):
    proc = shell(f"devices --artifact {tmp_path / 'nope'} --json > /dev/full")
    assert proc.returncode == 3, proc.stderr
    one_error_line(proc.stderr, "artifact_missing")


# -- numbers: NaN, infinity, ports --------------------------------------------------------------------

def test_score_max_error_rate_nan_is_refused(text_art, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("good movie\n")
    out = tmp_path / "o.jsonl"
    res = run("score", text_art, src, "-o", out, "--quiet", "--max-error-rate", "nan")
    assert res.exit_code == 2 and "--max-error-rate" in res.stderr and "Traceback" not in res.output, res.output
    assert not out.exists()                                      # refused before anything ran


@pytest.mark.parametrize("option,value", [("--drain-timeout", "nan"), ("--drain-timeout", "inf"),
                                          ("--read-timeout", "nan"), ("--batch-delay-ms", "nan"),
                                          ("--port", "-1"), ("--port", "70000"), ("--grpc-port", "99999")])
def test_serve_refuses_non_finite_times_and_ports_out_of_range(option, value, text_art):
    res = run("serve", text_art, "--no-grpc", option, value)
    assert res.exit_code == 2 and option in res.stderr, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


# -- an option given twice ---------------------------------------------------------------------------

def test_an_option_of_one_value_given_twice_is_refused(text_art, tmp_path):
    res = run("infer", text_art, "--text", "good", "--text", "bad", "--json")
    assert res.exit_code == 2 and "--text given more than once with different values" in res.stderr, res.output
    assert res.stdout == ""                                     # no result for 'bad' only
    src = tmp_path / "in.txt"
    src.write_text("good movie\n")
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    res = run("score", text_art, src, "-o", a, "--output", b, "--quiet")
    assert res.exit_code == 2 and "given more than once" in res.stderr, res.output
    assert not a.exists() and not b.exists()
    res = run("import", tmp_path / "m.tflite", "-o", tmp_path / "imp", "--letterbox", "--stretch")
    assert res.exit_code == 2 and "--letterbox / --stretch given more than once" in res.stderr, res.output
    # a plain flag twice means the same thing; a repeatable option stays repeatable
    res = run("infer", text_art, "--text", "good", "--json", "--json", "--limit", "max_text_chars=100",
              "--limit", "deadline_ms=4000")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["prediction"] in ("negative", "positive")


def test_one_limit_key_given_twice_is_refused(text_art):
    res = run("infer", text_art, "--text", "good", "--limit", "max_text_chars=3", "--limit", "max_text_chars=100")
    assert res.exit_code == 2, res.output                        # was: exit 0, the lower limit dropped
    one_error_line(res.stderr, "input_invalid")
    assert "max_text_chars given more than once with different values" in res.stderr
    res = run("infer", text_art, "--text", "good", "--limit", "max_text_chars=100", "--limit", "max_text_chars=100")
    assert res.exit_code == 0, res.output                        # the same value twice loses nothing


@pytest.mark.parametrize("value", ["-1", "2", "97", "inf", "nan"])
def test_eval_min_accuracy_is_a_fraction(make_artifact, tmp_path, value):
    """-1 was a gate every run passed, 97 or inf one every run failed (exit 1, as if the model were bad)."""
    from click.testing import CliRunner

    from edge_runtime.cli import main

    data = tmp_path / "d.tsv"
    data.write_text("good film\tpositive\n")
    res = CliRunner().invoke(main, ["eval", str(make_artifact()), str(data), "--min-accuracy", value])
    assert res.exit_code == 2 and "--min-accuracy" in res.output and "fraction" in res.output, res.output
