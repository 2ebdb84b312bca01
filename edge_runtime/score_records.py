"""The record the ``edge-infer score`` input readers yield (``Record``), and the line reader the
text and JSONL readers share: bounded by ``cap``, an over-long line kept as its head and tail
(``_Overlong``). See ``score_inputs``."""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from . import error_codes as ec
from .errors import InputError


@dataclass
class Record:
    index: int
    id: Any
    value: Any = None
    error: InputError | None = None
    line: int | None = None          # 1-based line of the input where the record starts


_TAIL = 1 << 16


@dataclass
class _Overlong:
    """A line longer than the cap: its first ``cap`` bytes and its last ``_TAIL`` (where a JSONL
    record's id may be, before or after the long value)."""
    head: bytes
    tail: bytes


def _lines(path: Path, cap: int) -> Iterator[tuple[bytes | _Overlong, int]]:
    """(line without its newline, or ``_Overlong`` when longer than ``cap``; 1-based line number). A
    UTF-8 byte order mark before the first line is dropped."""
    with open(path, "rb") as fh:
        number = 0
        while True:
            line = fh.readline(cap + 1)
            if not line:
                return
            number += 1
            if number == 1:
                refuse_wide_bom(line, path)
                if line.startswith(codecs.BOM_UTF8):
                    line = line[len(codecs.BOM_UTF8):]
            if len(line) > cap and not line.endswith(b"\n"):
                tail = line[-_TAIL:]
                while True:               # skip the rest of the over-long line, keeping its end
                    more = fh.readline(1 << 20)
                    tail = (tail + more)[-_TAIL - 2:]
                    if not more or more.endswith(b"\n"):
                        break
                yield _Overlong(line[:cap], tail.rstrip(b"\n").rstrip(b"\r")[-_TAIL:]), number
                continue
            yield line.rstrip(b"\n").rstrip(b"\r"), number


_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
               (codecs.BOM_UTF16_BE, "UTF-16"))


def refuse_wide_bom(first: bytes, path) -> None:
    """Refuse (``input_bad_encoding``) an input that starts with a UTF-16 or UTF-32 byte order mark
    (Notepad's and Excel's "Unicode text"): read as UTF-8 lines, its first line is undecodable and
    every later one a text with a NUL byte between its letters (``\\x00b\\x00a\\x00d``), scored ``ok``;
    a line end's ``\\x00`` even makes one record more than the file has lines."""
    for bom, name in _WIDE_BOMS:
        if first.startswith(bom):
            raise InputError(f"{path} is {name} text (it starts with a {name} byte order mark); score reads UTF-8: "
                             f"convert it (iconv -f {name} -t UTF-8)", code=ec.INPUT_BAD_ENCODING)


def _too_long(cap: int) -> InputError:
    return InputError(f"input line is longer than {cap} bytes", code=ec.INPUT_TOO_LARGE, limit=cap)
