"""What the score and shadow hardening tests share: the CLI runner, a strict reader of output
lines, a small text input, and the outputs ``--force``/``--resume`` must never touch (a FIFO,
a link to one, the input itself by path, symlink or hard link)."""

import json
import os
from pathlib import Path

from click.testing import CliRunner

from edge_runtime.cli import main


def run_cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def cli_shadow(a, b, data, *flags):
    """``edge-infer shadow A B DATA --quiet FLAGS``, never a traceback in its output."""
    res = run_cli("shadow", a, b, data, "--quiet", *flags)
    assert "Traceback" not in res.output, res.output
    return res


def no_constant(name):
    raise ValueError(f"{name} is not strict JSON")


def strict_lines(path):
    """The output's lines, read as strict UTF-8 and strict JSON (no NaN / Infinity)."""
    text = Path(path).read_bytes().decode("utf-8")          # raises on a raw undecodable byte
    return [json.loads(x, parse_constant=no_constant) for x in text.splitlines()]


def text_input(tmp_path, text="good\nbad\nawful\n"):
    src = tmp_path / "in.txt"
    src.write_text(text)
    return src


def fifo_output(tmp_path, via: str) -> tuple[Path, Path]:
    """(the FIFO, the ``-o`` path): the FIFO itself (``via="fifo"``) or a symlink to it."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = fifo if via == "fifo" else tmp_path / "link"
    if via == "link-to-fifo":
        out.symlink_to(fifo)
    return fifo, out


def input_as_output(src: Path, tmp_path, how: str) -> Path:
    """An ``-o`` path that is the input ``src``: the same path, a symlink or a hard link to it."""
    out = src if how == "same" else tmp_path / "out.txt"
    if how == "symlink":
        out.symlink_to(src)
    elif how == "hardlink":
        os.link(src, out)
    return out
