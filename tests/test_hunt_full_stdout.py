"""stdout that cannot take what click or score writes (``> /dev/full``): ``--help``, ``--version`` and
usage text are written before any command's guard runs, and score's record lines after it, from its own
buffer. Both ended in a bare ``OSError``: a traceback (exit 1) for ``--help``, ``error: OSError`` (exit 1)
for ``score -o -``. Now the typed output error (exit 2) on one line, as for every other command."""

import subprocess
import sys

import pytest


def shell(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", f"exec {sys.executable} -m edge_runtime {cmd}"], capture_output=True,
                          text=True, timeout=120)


def one_error_line(proc, code: str = "input_invalid"):
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert [ln for ln in lines if ln.startswith("error")] == [lines[-1]], proc.stderr
    assert lines[-1].startswith(f"error [{code}]") and "<stdout>" in lines[-1] and "No space left" in lines[-1]


@pytest.mark.parametrize("args", ["--help", "--version", "infer --help", "score --help"])
def test_help_onto_a_full_stdout_is_a_typed_error(args):
    one_error_line(shell(f"{args} > /dev/full"))


@pytest.mark.parametrize("json", ["", "--json"])
def test_score_onto_a_full_stdout_is_a_typed_error(text_art, tmp_path, json):
    src = tmp_path / "in.txt"
    src.write_text("good movie\nbad film\n" * 40)
    one_error_line(shell(f"score {text_art} {src} -o - --quiet {json} > /dev/full"))


def test_help_into_a_pipe_still_works():
    proc = shell("--help | head -1")
    assert proc.returncode == 0 and proc.stdout.startswith("Usage:"), proc.stderr


@pytest.mark.parametrize("args", ["--help", "--version", "infer --help"])
def test_help_onto_a_closed_stdout_is_a_typed_error_not_exit_0(args):
    # click wrote to no stdout at all (>&-) and exited 0, as commands did before their guard refused it
    proc = shell(f"{args} >&-")
    assert proc.returncode == 2 and proc.stderr.startswith("error [input_invalid]") and "closed" in proc.stderr, \
        proc.stderr
