"""Input readers for ``edge-infer score``: JSONL, CSV, plain text, an image folder.

Each reader yields ``Record(index, id, value, error, line)`` in input order,
one per input, and never stops on a bad record: an unparsable JSON line, a
missing field, an over-long line or an undecodable row becomes a record
carrying a typed ``InputError``, so it still gets its line in the output.

Ids and line numbers:

- ``line`` is the 1-based line of the input file where the record starts
  (``None`` for an image folder);
- plain text: ``id`` is the line number (a text line has no other id);
- JSONL: ``id`` is the record's ``--id-field`` value (default ``id``);
- CSV/TSV: ``id`` is the ``--id-field`` column (default: the ``id`` column
  when the header has one);
- image folder: ``id`` is the path relative to the folder.

A JSONL/CSV record without an id of its own (an unparsable line, an object
without the id field, a row whose id cell is missing or empty) gets ``id``
``None``, never its line number: a line number could collide with a real id.
Its ``line`` says where it was. A JSONL id JSON cannot write as it is (an
object, a list, NaN or infinity) is its JSON text (``'{"a": 1}'``, ``"NaN"``).

Image paths: a relative path in a JSONL field or a CSV/TSV column named
``image``, ``path`` or ``file`` is taken from the input file's folder (an
absolute path as it is, ``""`` stays empty and is rejected as ``input_empty``);
in a field of another name (``--field img``), from the working directory. An
input that is no regular file (a pipe, ``<(...)``) has no folder: its relative
paths are taken from the working directory (``/dev/stdin`` redirected from a
file: that file's folder). See :func:`image_base`.

A blank JSONL line (empty or white space only) is no record: it gets no
index and no output line (``line`` still counts it). A blank line of a text
input is one (an empty text, rejected as ``input_empty``): there the line is
the input. A UTF-8 byte order mark at the start of a file (Excel's CSV) is
dropped. The input may be a pipe or a FIFO (``<(...)``, ``/dev/stdin``): it is
read once (``count_records`` says None rather than read it twice).

``input_fingerprint`` identifies an input for ``score --resume``: size and
sha256 of a file; for an image folder, the sha256 over the sorted relative
names, sizes and content hashes of the images the reader would yield.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from . import error_codes as ec
from .errors import InputError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
FORMATS = ("jsonl", "csv", "text", "images")


@dataclass
class Record:
    index: int
    id: Any
    value: Any = None
    error: InputError | None = None
    line: int | None = None          # 1-based line of the input where the record starts


class RecordStream:
    """The iterator ``read_records`` returns; it remembers what it reads (``source``),
    so ``score()`` can record the job's input without being told."""

    def __init__(self, records: Iterator[Record], source: dict):
        self._it = iter(records)
        self.source = source

    def __iter__(self):
        return self

    def __next__(self) -> Record:
        return next(self._it)


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
    """(line without its newline, or None when longer than ``cap``; 1-based line number). A UTF-8
    byte order mark before the first line is dropped."""
    with open(path, "rb") as fh:
        number = 0
        while True:
            line = fh.readline(cap + 1)
            if not line:
                return
            number += 1
            if number == 1 and line.startswith(codecs.BOM_UTF8):
                line = line[len(codecs.BOM_UTF8):]
            if len(line) > cap and not line.endswith(b"\n"):
                while True:               # skip the rest of the over-long line
                    more = fh.readline(1 << 20)
                    if not more or more.endswith(b"\n"):
                        break
                yield None, number
                continue
            yield line.rstrip(b"\n").rstrip(b"\r"), number


def _too_long(cap: int) -> InputError:
    return InputError(f"input line is longer than {cap} bytes", code=ec.INPUT_TOO_LARGE, limit=cap)


def read_text(path: Path, cap: int) -> Iterator[Record]:
    for i, (line, number) in enumerate(_lines(path, cap)):
        if line is None:
            yield Record(i, number, error=_too_long(cap), line=number)
            continue
        try:
            yield Record(i, number, line.decode("utf-8"), line=number)
        except UnicodeDecodeError as exc:
            yield Record(i, number, error=InputError(f"line {number} is not valid UTF-8 ({exc.reason} at byte "
                                                      f"{exc.start})", code=ec.INPUT_BAD_ENCODING), line=number)


IMAGE_PATH_FIELDS = ("image", "path", "file")


def image_base(path: Path) -> Path | None:
    """The folder a relative image path in ``path``'s records (a field or column named in
    ``IMAGE_PATH_FIELDS``) is taken from: the input file's folder; None (the working directory)
    for an input that is no regular file (a pipe, ``<(...)``), which has no folder. ``/dev/stdin``
    or ``/dev/fd/N`` redirected from a file: that file's folder, not ``/dev``."""
    try:
        st = os.stat(path)
    except OSError:
        return path.parent
    if not stat.S_ISREG(st.st_mode):
        return None
    if path.absolute().parts[1:2] in (("dev",), ("proc",)):       # a descriptor's alias: where it leads
        return Path(os.path.realpath(path)).parent
    return path.parent


def _image_path(value, field: str, base: Path | None):
    """``value`` of ``field`` as the reader yields it: a relative image path joined to ``base``
    (an absolute one unchanged, ``""`` left empty); any other field or value as it is."""
    if base is not None and field in IMAGE_PATH_FIELDS and isinstance(value, str) and value:
        return str(base / value)
    return value


def read_jsonl(path: Path, cap: int, field: str, id_field: str | None) -> Iterator[Record]:
    base = image_base(path)
    id_field = id_field or "id"
    for i, line, number in _jsonl_lines(path, cap):
        if line is None:
            yield Record(i, None, error=_too_long(cap), line=number)
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            yield Record(i, None, error=InputError(f"line {number} is not JSON: {exc}"[:300], code=ec.INPUT_BAD_JSON),
                         line=number)
            continue
        if not isinstance(obj, dict):
            yield Record(i, None, error=InputError(f"line {number} is a JSON {type(obj).__name__}, not an object",
                                                   code=ec.INPUT_BAD_JSON), line=number)
            continue
        rid = _json_id(obj.get(id_field))
        if field not in obj:
            yield Record(i, rid, error=InputError(f"line {number} has no field {field!r}", code=ec.INPUT_FIELD_MISSING),
                         line=number)
            continue
        yield Record(i, rid, _image_path(obj[field], field, base), line=number)   # relative to the file


def _json_id(rid):
    """A JSONL id as the output writes it: a string, number, bool or null as it is; NaN, infinity
    (the caller's data, not a failed result) and anything else as its JSON text."""
    if isinstance(rid, float) and not math.isfinite(rid):
        return json.dumps(rid)
    if not isinstance(rid, (str, int, float, bool)) and rid is not None:
        return json.dumps(rid)[:200]
    return rid


def _jsonl_lines(path: Path, cap: int) -> Iterator[tuple[int, bytes | None, int]]:
    """``_lines`` without the blank ones (no record), each with its record index."""
    i = 0
    for line, number in _lines(path, cap):
        if line is not None and not line.strip():
            continue
        yield i, line, number
        i += 1


def _csv_open(path: Path):
    """A CSV/TSV file as text: UTF-8 with a leading byte order mark dropped (Excel's export), an
    undecodable byte kept as a lone surrogate (the output escapes it)."""
    return open(path, newline="", encoding="utf-8-sig", errors="surrogateescape")


def _csv_reader(path: Path, fh):
    return csv.reader(fh, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")


def read_csv(path: Path, cap: int, column: str, id_column: str | None) -> Iterator[Record]:
    base = image_base(path)
    csv.field_size_limit(cap)
    with _csv_open(path) as fh:
        reader = _csv_reader(path, fh)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise InputError(f"{path}: unreadable CSV header: {exc}", code=ec.INPUT_BAD_CSV) from None
        if column not in header:
            raise InputError(f"{path}: no column {column!r} (columns: {', '.join(header)[:300]})",
                             code=ec.INPUT_FIELD_MISSING)
        col = header.index(column)
        id_col: int | None
        if id_column:
            if id_column not in header:
                raise InputError(f"{path}: no id column {id_column!r}", code=ec.INPUT_FIELD_MISSING)
            id_col = header.index(id_column)
        else:       # the default: the ``id`` column when there is one (the --id-field help says so)
            id_col = header.index("id") if "id" in header else None
        i = 0
        while True:
            start = reader.line_num + 1         # the line this row starts on (a quoted field may span lines)
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield Record(i, None, error=InputError(f"row at line {start}: {exc}", code=ec.INPUT_BAD_CSV),
                             line=start)
                i += 1
                continue
            rid = row[id_col] if id_col is not None and id_col < len(row) and row[id_col] != "" else None
            if col >= len(row):
                yield Record(i, rid, error=InputError(f"row at line {start} has no {column!r} value",
                                                      code=ec.INPUT_FIELD_MISSING), line=start)
            else:
                yield Record(i, rid, _image_path(row[col], column, base), line=start)   # as JSONL's
            i += 1


def image_files(path: Path) -> list[tuple[str, Path]]:
    """(relative posix name, path) of every image ``read_images`` yields, in its order."""
    files = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files += [Path(root) / n for n in sorted(names)
                  if not n.startswith(".") and Path(n).suffix.lower() in IMAGE_SUFFIXES]
    return sorted(((f.relative_to(path).as_posix(), f) for f in files), key=lambda t: t[0])


def read_images(path: Path) -> Iterator[Record]:
    for i, (rel, f) in enumerate(image_files(path)):
        yield Record(i, rel, str(f))


def _sha256_file(path: Path) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()


def input_fingerprint(path, fmt: str | None = None) -> dict:
    """What identifies an input across runs (``score --resume``), independent of its path
    and mtime: ``{"kind": "file", "format", "bytes", "sha256"}`` for a file,
    ``{"kind": "folder", "format", "files", "bytes", "sha256"}`` for an image folder (the
    sha256 over each image's relative name, size and sha256, in the reader's order).
    Anything else (a pipe, a missing path) gets ``sha256`` ``None``: it cannot be checked."""
    path = Path(path)
    fmt = fmt or detect_format(path)
    try:
        if fmt == "images" and path.is_dir():
            h, total, n = hashlib.sha256(), 0, 0
            for rel, f in image_files(path):
                size, digest = _sha256_file(f)
                h.update(f"{rel}\0{size}\0{digest}\n".encode("utf-8", "surrogateescape"))
                total += size
                n += 1
            return {"kind": "folder", "format": fmt, "files": n, "bytes": total, "sha256": h.hexdigest()}
        if path.is_file():
            size, digest = _sha256_file(path)
            return {"kind": "file", "format": fmt, "bytes": size, "sha256": digest}
    except OSError as exc:
        raise InputError(f"cannot read input {path}: {exc.strerror or exc}", code=ec.INPUT_FILE_UNREADABLE) from None
    return {"kind": "other", "format": fmt, "sha256": None}


def effective_options(fmt: str, field: str | None, id_field: str | None) -> dict:
    """The reader options that shape the records of a ``fmt`` input, normalised: the field
    and id field only where the format reads them, the default id field spelled out."""
    if fmt in ("jsonl", "csv"):
        return {"format": fmt, "field": field, "id_field": id_field or "id"}
    return {"format": fmt, "field": None, "id_field": None}


def read_records(path, fmt: str | None = None, *, field: str = "text", id_field: str | None = None,
                 cap: int = 8 << 20) -> RecordStream:
    path = Path(path)
    if not path.exists():
        raise InputError(f"input {path} does not exist", code=ec.INPUT_MISSING)
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r} ({', '.join(FORMATS)})", code=ec.INPUT_INVALID)
    source = {"path": str(path), **effective_options(fmt, field, id_field)}
    if fmt == "images":
        if not path.is_dir():
            raise InputError(f"{path} is not a folder of images", code=ec.INPUT_INVALID)
        return RecordStream(read_images(path), source)
    if path.is_dir():
        raise InputError(f"{path} is a folder; --format {fmt} wants a file", code=ec.INPUT_INVALID)
    if fmt == "text":
        return RecordStream(read_text(path, cap), source)
    if fmt == "jsonl":
        return RecordStream(read_jsonl(path, cap, field, id_field), source)
    return RecordStream(read_csv(path, cap, field, id_field), source)


def _count_csv(path: Path, cap: int) -> int:
    """The rows ``read_csv`` yields: CSV records (a quoted field may span lines), a bad row one."""
    csv.field_size_limit(cap)
    with _csv_open(path) as fh:
        reader = _csv_reader(path, fh)
        n = -1                                  # the header is no record
        while True:
            try:
                next(reader)
            except StopIteration:
                return max(n, 0)
            except csv.Error:
                pass
            n += 1


def _count_lines(path: Path) -> int:
    """Lines (the last one may lack its newline), in blocks: a text input's records."""
    n, last = 0, b"\n"
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def count_records(path, fmt: str | None = None, *, cap: int = 8 << 20) -> int | None:
    """How many records a reader will yield (for progress); None if unknown: a pipe, a FIFO or
    ``/dev/stdin`` is not read (it can be read once, by the reader). ``cap``: ``read_records``'."""
    path = Path(path)
    fmt = fmt or detect_format(path)
    try:
        if fmt == "images":
            return sum(1 for _ in read_images(path))
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        if fmt == "csv":
            return _count_csv(path, cap)
        if fmt == "jsonl":
            return sum(1 for _ in _jsonl_lines(path, cap))     # blank lines are no record
        return _count_lines(path)
    except OSError:
        return None


__all__ = ["Record", "RecordStream", "read_records", "count_records", "detect_format", "input_fingerprint",
           "effective_options", "image_files", "image_base", "FORMATS", "IMAGE_PATH_FIELDS"]
