"""``--image -`` looked for a file named '-' (input_file_unreadable) while ``--text -`` read stdin: a
pipeline (``curl ... | edge-infer infer ART --image -``) could not feed an image. Now stdin is read, at most
the image limit, and an empty or closed stdin is a typed input error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HELD_OUT = Path(__file__).resolve().parents[1] / "models" / "zoo" / "digits-cnn" / "held_out"


def run(args, stdin) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge_runtime", *map(str, args)], stdin=stdin, capture_output=True,
                          timeout=120)


def test_an_image_piped_into_stdin_is_the_same_answer_as_the_file(digits_artifact, tmp_path):
    img = HELD_OUT / "3" / "0013.png"
    by_file = json.loads(run(["infer", digits_artifact, "--image", img, "--json"], subprocess.DEVNULL).stdout)
    with open(img, "rb") as fh:
        proc = run(["infer", digits_artifact, "--image", "-", "--json", "--draw", tmp_path / "d.png"], fh)
    assert proc.returncode == 0, proc.stderr
    by_stdin = json.loads(proc.stdout)
    assert by_stdin["prediction"] == by_file["prediction"] == "3" and by_stdin["scores"] == by_file["scores"]
    assert (tmp_path / "d.png").stat().st_size > 0


def test_an_empty_or_oversized_stdin_is_a_typed_input_error(digits_artifact, tmp_path):
    proc = run(["infer", digits_artifact, "--image", "-"], subprocess.DEVNULL)
    assert proc.returncode == 2 and b"error [input_invalid]" in proc.stderr and b"stdin was empty" in proc.stderr
    big = tmp_path / "big.bin"
    big.write_bytes(b"\x89PNG" + b"\0" * 5000)
    with open(big, "rb") as fh:
        proc = run(["infer", digits_artifact, "--image", "-", "--limit", "max_image_bytes=1000"], fh)
    assert proc.returncode == 2 and b"error [input_too_large]" in proc.stderr and b"1000 bytes" in proc.stderr
