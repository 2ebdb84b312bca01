"""Input readers for ``edge-infer score``: JSONL, CSV, plain text, an image folder.

Each reader yields ``Record(index, id, value, error)`` in input order, one per
input, and never stops on a bad record: an unparsable JSON line, a missing
field, an over-long line or an undecodable row becomes a record carrying a
typed ``InputError``, so it still gets its line in the output.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .errors import InputError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
FORMATS = ("jsonl", "csv", "text", "images")


@dataclass
class Record:
    index: int
    id: Any
    value: Any = None
    error: InputError | None = None


def detect_format(path: Path) -> str:
    if path.is_dir():
        return "images"
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    return "text"


def _lines(path: Path, cap: int) -> Iterator[tuple[bytes | None, int]]:
    """(line without its newline, or None when longer than ``cap``; 1-based line number)."""
    with open(path, "rb") as fh:
        number = 0
        while True:
            line = fh.readline(cap + 1)
            if not line:
                return
            number += 1
            if len(line) > cap and not line.endswith(b"\n"):
                while True:               # skip the rest of the over-long line
                    more = fh.readline(1 << 20)
                    if not more or more.endswith(b"\n"):
                        break
                yield None, number
                continue
            yield line.rstrip(b"\n").rstrip(b"\r"), number


def _too_long(cap: int) -> InputError:
    return InputError(f"input line is longer than {cap} bytes", code="input_too_large", limit=cap)


def read_text(path: Path, cap: int) -> Iterator[Record]:
    for i, (line, number) in enumerate(_lines(path, cap)):
        if line is None:
            yield Record(i, number, error=_too_long(cap))
            continue
        try:
            yield Record(i, number, line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            yield Record(i, number, error=InputError(f"line {number} is not valid UTF-8 ({exc.reason} at byte "
                                                      f"{exc.start})", code="input_bad_encoding"))


def read_jsonl(path: Path, cap: int, field: str, id_field: str | None) -> Iterator[Record]:
    base = path.parent
    for i, (line, number) in enumerate(_lines(path, cap)):
        if line is None:
            yield Record(i, number, error=_too_long(cap))
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            yield Record(i, number, error=InputError(f"line {number} is not JSON: {exc}"[:300], code="input_bad_json"))
            continue
        if not isinstance(obj, dict):
            yield Record(i, number, error=InputError(f"line {number} is a JSON {type(obj).__name__}, not an object",
                                                     code="input_bad_json"))
            continue
        rid = obj.get(id_field, number) if id_field else obj.get("id", number)
        if not isinstance(rid, (str, int, float, bool)) and rid is not None:
            rid = json.dumps(rid)[:200]
        if field not in obj:
            yield Record(i, rid, error=InputError(f"line {number} has no field {field!r}", code="input_field_missing"))
            continue
        value = obj[field]
        if field in ("image", "path", "file") and isinstance(value, str):
            value = str(base / value)          # image paths are relative to the JSONL file
        yield Record(i, rid, value)


def read_csv(path: Path, cap: int, column: str, id_column: str | None) -> Iterator[Record]:
    csv.field_size_limit(cap)
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise InputError(f"{path}: unreadable CSV header: {exc}", code="input_bad_csv") from None
        if column not in header:
            raise InputError(f"{path}: no column {column!r} (columns: {', '.join(header)[:300]})",
                             code="input_field_missing")
        col = header.index(column)
        id_col = header.index(id_column) if id_column and id_column in header else None
        if id_column and id_col is None:
            raise InputError(f"{path}: no id column {id_column!r}", code="input_field_missing")
        i = 0
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield Record(i, reader.line_num, error=InputError(f"row at line {reader.line_num}: {exc}",
                                                                  code="input_bad_csv"))
                i += 1
                continue
            rid = row[id_col] if id_col is not None and id_col < len(row) else reader.line_num
            if col >= len(row):
                yield Record(i, rid, error=InputError(f"row at line {reader.line_num} has no {column!r} value",
                                                      code="input_field_missing"))
            else:
                yield Record(i, rid, row[col])
            i += 1


def read_images(path: Path) -> Iterator[Record]:
    files = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files += [Path(root) / n for n in sorted(names)
                  if not n.startswith(".") and Path(n).suffix.lower() in IMAGE_SUFFIXES]
    for i, f in enumerate(sorted(files, key=lambda p: p.relative_to(path).as_posix())):
        yield Record(i, f.relative_to(path).as_posix(), str(f))


def read_records(path, fmt: str | None = None, *, field: str = "text", id_field: str | None = None,
                 cap: int = 8 << 20) -> Iterator[Record]:
    path = Path(path)
    if not path.exists():
        raise InputError(f"input {path} does not exist", code="input_missing")
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r} ({', '.join(FORMATS)})", code="input_invalid")
    if fmt == "images":
        if not path.is_dir():
            raise InputError(f"{path} is not a folder of images", code="input_invalid")
        return read_images(path)
    if path.is_dir():
        raise InputError(f"{path} is a folder; --format {fmt} wants a file", code="input_invalid")
    if fmt == "text":
        return read_text(path, cap)
    if fmt == "jsonl":
        return read_jsonl(path, cap, field, id_field)
    return read_csv(path, cap, field, id_field)


def count_records(path, fmt: str | None = None) -> int | None:
    """How many records a reader will yield (for progress), cheaply; None if unknown."""
    path = Path(path)
    fmt = fmt or detect_format(path)
    try:
        if fmt == "images":
            return sum(1 for _ in read_images(path))
        with open(path, "rb") as fh:
            n, last = 0, b"\n"
            for block in iter(lambda: fh.read(1 << 20), b""):
                n += block.count(b"\n")
                last = block[-1:]
            n += last != b"\n"
        return max(n - 1, 0) if fmt == "csv" else n      # csv: minus the header (quoted newlines aside)
    except OSError:
        return None


__all__ = ["Record", "read_records", "count_records", "detect_format", "FORMATS"]
