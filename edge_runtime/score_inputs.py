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

A record refused unread keeps its id: an over-long CSV/TSV row (over ``cap``
bytes, a quoted field over lines included: one record, ``input_too_large``) its
id cell; an over-long JSONL line its top-level id member when its first ``cap``
bytes or its last 64 KiB hold it whole; a JSONL line that is not UTF-8
(``input_bad_encoding``) the id it has read with its bad bytes as lone
surrogates. A CSV quoted field that never closes makes its row an
``input_bad_csv`` record and the lines after that row's first line are read
again as rows (``csv`` made them one field: every later record lost). See
``_CsvScanner``. An image subfolder that cannot be listed is one
``input_file_unreadable`` record (id ``"sub/"``), not silently none.

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
import re
import stat
import tempfile
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
            if number == 1 and line.startswith(codecs.BOM_UTF8):
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


def _too_long(cap: int) -> InputError:
    return InputError(f"input line is longer than {cap} bytes", code=ec.INPUT_TOO_LARGE, limit=cap)


def read_text(path: Path, cap: int) -> Iterator[Record]:
    for i, (line, number) in enumerate(_lines(path, cap)):
        if isinstance(line, _Overlong):
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
        if isinstance(line, _Overlong):         # not read, but its id is found where it can be
            yield Record(i, _json_id(_overlong_id(line, id_field)), error=_too_long(cap), line=number)
            continue
        try:
            obj = json.loads(line)
        except UnicodeDecodeError as exc:       # not UTF-8: refused, with its id when it parses without that byte
            yield Record(i, _json_id(_undecodable_id(line, id_field)), error=InputError(
                f"line {number} is not valid UTF-8 ({exc.reason} at byte {exc.start})", code=ec.INPUT_BAD_ENCODING),
                line=number)
            continue
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


_MISSING = object()
_WS = " \t\r\n"


def _members(text: str, i: int, id_field: str, whole: bool):
    """The value of top-level member ``id_field`` in the JSON object members starting at ``text[i]``
    (just after ``{``, or at a member's key), walked one ``"key": value`` at a time; ``_MISSING``
    when the walk stops first (a value cut off at the end of ``text``, anything not JSON). ``whole``:
    the members must run to the object's closing ``}`` and the end of ``text`` (a line's tail), or the
    find does not count (a key of a nested object, or inside a string)."""
    dec = json.JSONDecoder()
    found: Any = _MISSING
    n = len(text)
    while True:
        while i < n and text[i] in _WS:
            i += 1
        if i >= n or text[i] != '"':
            break
        try:
            key, i = dec.raw_decode(text, i)             # a string: text[i] is its quote
            while i < n and text[i] in _WS:
                i += 1
            if i >= n or text[i] != ":":
                break
            i += 1
            while i < n and text[i] in _WS:
                i += 1
            value, i = dec.raw_decode(text, i)
        except (ValueError, RecursionError):
            break
        while i < n and text[i] in _WS:
            i += 1
        if i >= n:                  # a value at the very end may be cut short (123 of 12345)
            break
        if key == id_field and found is _MISSING:
            found = value
            if not whole:
                return found
        if text[i] == ",":
            i += 1
            continue
        if whole and text[i] == "}" and not text[i + 1:].strip(_WS):
            return found
        break
    return _MISSING if whole else found


def _overlong_id(line: _Overlong, id_field: str):
    """The id of a JSONL line too long to parse: the top-level ``id_field`` among the members its
    first bytes hold whole, else among the last members, found in its tail from an unescaped
    ``"id_field":`` that the members run on from to the object's end (a nested object's key, or the
    text of a string, does not). None when neither holds it."""
    head = line.head.decode("utf-8", "surrogateescape")
    start = len(head) - len(head.lstrip(_WS))
    if head[start:start + 1] == "{":
        found = _members(head, start + 1, id_field, whole=False)
        if found is not _MISSING:
            return found
    tail = line.tail.decode("utf-8", "surrogateescape")
    key = json.dumps(id_field, ensure_ascii=False)
    at = tail.rfind(key)
    while at > 0:
        slashes = len(tail[:at]) - len(tail[:at].rstrip("\\"))
        if slashes < at and slashes % 2 == 0:        # the key's quote is no string's escaped quote
            found = _members(tail, at, id_field, whole=True)
            if found is not _MISSING:
                return found
        at = tail.rfind(key, 0, at)
    return None


def _undecodable_id(line: bytes, id_field: str):
    """The id of a JSONL line that is not UTF-8, read with its bad bytes as lone surrogates (as a
    CSV's); None when it is no JSON object even so."""
    try:
        obj = json.loads(line.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return None
    return obj.get(id_field) if isinstance(obj, dict) else None


def _jsonl_lines(path: Path, cap: int) -> Iterator[tuple[int, bytes | _Overlong, int]]:
    """``_lines`` without the blank ones (no record), each with its record index."""
    i = 0
    for line, number in _lines(path, cap):
        if isinstance(line, bytes) and not line.strip():
            continue
        yield i, line, number
        i += 1


_CR, _LF, _QUOTE = 13, 10, 34
_START_RECORD, _START_FIELD, _IN_FIELD, _IN_QUOTED, _QUOTE_IN_QUOTED = range(5)
_BLOCK = 1 << 16


@dataclass
class _CsvRow:
    line: int                        # the 1-based line it starts on
    fields: list[str] | None         # None: an over-long row, or a quoted field that never closes
    error: InputError | None = None
    id_cell: str | None = None       # such a row's cell in the id column (``_CsvScanner.keep``), if it has one


class _Held:
    """The input from a row's second line on, while that row is in a quoted field: read again as rows
    if the field never closes. The blocks themselves (no copy) up to ``2 * cap`` bytes, then a
    temporary file (a pipe cannot be read twice)."""

    def __init__(self, buf: bytes, at: int, line: int, after_cr: bool, cap: int):
        self.blocks, self.size, self.line, self.after_cr, self.cap = [buf[at:]], len(buf) - at, line, after_cr, cap
        self.file: Any = None

    def add(self, block: bytes) -> None:
        if self.file is None:
            self.blocks.append(block)
            self.size += len(block)
            if self.size > 2 * self.cap:
                self.file = tempfile.TemporaryFile()
                for b in self.blocks:
                    self.file.write(b)
                self.blocks = []
        else:
            self.file.write(block)

    def replay(self) -> Iterator[bytes]:
        if self.file is None:
            yield from (b for b in self.blocks if b)       # an empty block would read as the end
            return
        with self.file:
            self.file.seek(0)
            yield from iter(lambda: self.file.read(_BLOCK), b"")


class _CsvScanner:
    """The rows of a CSV/TSV byte stream, split and read as ``csv.reader`` (the excel dialect, a file
    opened with ``newline=""``) reads them: fields split at the delimiter; a field quoted when it starts
    with ``"`` (``""`` inside is one quote, ``"ab"c`` is ``abc``; a quote elsewhere is a character);
    a record ended by ``\\n``, ``\\r\\n`` or ``\\r`` outside quotes; a blank line a row without
    fields; each field UTF-8, an undecodable byte kept as a lone surrogate; a leading byte order mark
    dropped. Two things it does otherwise, so that no record is lost, merged or split:

    - a row over ``cap`` bytes (a quoted field spanning lines included) is one row,
      ``input_too_large``, read to its end without keeping it but for its cell in column ``keep``
      (the id column): its error line carries the row's id. (``csv`` raised on the over-long field,
      without the id, and read the rest of a quoted field's lines as rows of their own.)
    - a quoted field that never closes (its quote runs to the end of the input) makes its row an
      ``input_bad_csv`` row (with its id), and the lines after that row's first line are read again
      as rows. (``csv`` made them all one field of that row: every later record lost.)

    Whole lines without a quote are split in C, and a row whose quoted fields close as they should is
    read by ``csv`` itself; the state machine of ``_scan`` takes the rest. Memory is bounded by
    ``cap`` (see ``_Held``)."""

    def __init__(self, fh, delimiter: str, cap: int):
        self.fh, self.sep, self.delim, self.cap = fh, delimiter, ord(delimiter), cap
        self.keep: int | None = None
        d = re.escape(delimiter.encode())
        field = b'(?:"(?:[^"]|"")*"|[^"' + d + b'\r\n]*)'
        self._record = re.compile(field + b"(?:" + d + field + b")*(?:\r\n?|\n)")
        self._csv_limit = csv.field_size_limit()    # a row under it is read by csv itself
        self._field_end = re.compile(b"[" + d + b"\r\n]")
        self._quoted_end = re.compile(b'["\r\n]')

    def _blocks(self) -> Iterator[bytes]:
        block = self.fh.read(_BLOCK)
        while block and len(block) < 3 and codecs.BOM_UTF8.startswith(block):     # a pipe's first bytes
            more = self.fh.read(_BLOCK)
            if not more:
                break
            block += more
        if block.startswith(codecs.BOM_UTF8):
            block = block[len(codecs.BOM_UTF8):] or self.fh.read(_BLOCK)
        while block:
            yield block
            block = self.fh.read(_BLOCK)

    def rows(self) -> Iterator[_CsvRow]:
        blocks, line, after_cr = self._blocks(), 1, False
        while True:
            again = yield from self._scan(blocks, line, after_cr)
            if again is None:
                return
            blocks, line, after_cr = again.replay(), again.line, again.after_cr

    def _scan(self, blocks: Iterator[bytes], line: int, after_cr: bool):
        """Rows to the end of ``blocks``; then None, or the ``_Held`` input to read again when a quoted
        field never closed. ``after_cr``: the byte before ``blocks`` was a line-ending ``\\r``."""
        cap, delim = self.cap, self.delim
        keep = self.keep
        state = _START_RECORD
        buf, pos = b"", 0
        fields: list[bytes] = []
        cur = bytearray()
        size = nfields = 0
        too_long = False
        id_cell: bytes | None = None
        start = line
        held: _Held | None = None
        mark: tuple | None = None   # where ``held`` starts, until the row runs on into another block

        def add(chunk) -> None:
            nonlocal size, too_long, id_cell
            size += len(chunk)
            if too_long:                # only the id column's cell is kept (a cap and a byte: an over-long id is none)
                if nfields == keep and len(cur) <= cap:
                    cur.extend(chunk[:cap + 1 - len(cur)])
                return
            cur.extend(chunk)
            if size > cap:
                too_long = True
                if keep is not None and keep < len(fields):
                    id_cell = fields[keep]
                fields.clear()
                if nfields == keep:
                    del cur[cap + 1:]
                else:
                    cur.clear()

        def save() -> None:
            nonlocal nfields, id_cell
            if not too_long:
                fields.append(bytes(cur))
            elif nfields == keep:
                id_cell = bytes(cur)
            cur.clear()
            nfields += 1

        def cell() -> str | None:
            raw = id_cell if too_long else (fields[keep] if keep is not None and keep < len(fields) else None)
            return None if raw is None or len(raw) > cap else raw.decode("utf-8", "surrogateescape")

        def row() -> _CsvRow:
            if too_long:
                return _CsvRow(start, None, InputError(f"row at line {start} is longer than {cap} bytes",
                                                       code=ec.INPUT_TOO_LARGE, limit=cap), cell())
            return _CsvRow(start, [f.decode("utf-8", "surrogateescape") for f in fields])

        def run_to(stop: re.Pattern) -> int:
            """Add the bytes up to the next one ``stop`` matches to the field; read and return that byte
            (-1: the block ended first)."""
            nonlocal pos, after_cr
            m = stop.search(buf, pos)
            end = len(buf) if m is None else m.start()
            if end > pos:
                add(buf[pos:end])
                after_cr = False
            pos = end if m is None else end + 1
            return -1 if m is None else buf[end]

        while True:
            if pos >= len(buf):
                buf, pos = next(blocks, b""), 0
                if not buf:
                    break
                if mark is not None:            # a quoted field runs on past its block: keep what follows its row's line
                    held, mark = _Held(*mark), None
                if held is not None:
                    held.add(buf)
            if state == _START_RECORD:
                c = buf[pos]
                if after_cr and c == _LF:           # the \n of a \r\n line end
                    pos += 1
                    after_cr = False
                    continue
                after_cr = False
                quote = buf.find(b'"', pos)
                stop = len(buf) if quote < 0 else quote
                last = max(buf.rfind(b"\n", pos, stop), buf.rfind(b"\r", pos, stop))
                if last >= pos and last - pos < cap - 1:    # whole lines without a quote: one row each, in C
                    sep = self.sep
                    for text in buf[pos:last + 1].splitlines():
                        yield _CsvRow(line, text.decode("utf-8", "surrogateescape").split(sep) if text else [])
                        line += 1
                    pos = last + 1
                    after_cr = buf[last] == _CR
                    continue
                m = self._record.match(buf, pos) if c != _CR and c != _LF else None
                if m is not None and m.end() - pos < min(cap - 1, self._csv_limit):
                    text = buf[pos:m.end()]         # a whole row with quoted fields closed as they should be
                    yield _CsvRow(line, next(csv.reader([text.decode("utf-8", "surrogateescape")],
                                                        delimiter=self.sep)))
                    line += text.count(b"\n") + text.count(b"\r") - text.count(b"\r\n")
                    pos = m.end()
                    after_cr = buf[pos - 1] == _CR
                    continue
                start, fields, size, nfields, too_long, id_cell = line, [], 0, 0, False, None
                keep = self.keep             # set once the header is read
                cur.clear()
                if c == _CR or c == _LF:            # a blank line: a row without fields
                    pos += 1
                    line += 1
                    after_cr = c == _CR
                    yield _CsvRow(start, [])
                    continue
                state = _START_FIELD
            elif state == _START_FIELD:
                if buf[pos] == _QUOTE:
                    pos += 1
                    size += 1
                    state = _IN_QUOTED
                else:
                    state = _IN_FIELD
            elif state == _IN_FIELD:
                c = run_to(self._field_end)
                if c < 0:
                    continue
                size += 1
                save()
                if c == delim:
                    state = _START_FIELD
                else:                               # the row's end
                    line += 1
                    after_cr = c == _CR
                    state = _START_RECORD
                    held = mark = None
                    yield row()
            elif state == _IN_QUOTED:
                c = run_to(self._quoted_end)
                if c < 0:
                    continue
                if c == _QUOTE:
                    size += 1
                    after_cr = False
                    state = _QUOTE_IN_QUOTED
                    continue
                add(buf[pos - 1:pos])               # a line end inside the field is the field's
                if c == _CR or not after_cr:
                    line += 1
                    if line == start + 1:
                        mark = (buf, pos, line, c == _CR, cap)
                after_cr = c == _CR
            else:                                   # _QUOTE_IN_QUOTED
                if buf[pos] == _QUOTE:              # "" in a quoted field: one quote
                    pos += 1
                    add(b'"')
                    state = _IN_QUOTED
                else:                               # the delimiter or a line end closes the field; another
                    state = _IN_FIELD               # byte ("ab"c) is the field's, unquoted (csv's strict=False)
        if state == _START_RECORD:                  # the end of the input
            return None
        if state != _IN_QUOTED:                     # a last line without its line end
            save()
            yield row()
            return None
        yield _CsvRow(start, None, InputError(f"row at line {start}: its quoted field never closes (the quote runs to "
                                              f"the end of the input); the lines after it are read as rows",
                                              code=ec.INPUT_BAD_CSV), cell())
        return _Held(*mark) if mark is not None else held


def _csv_rows(path: Path, fh, cap: int) -> _CsvScanner:
    return _CsvScanner(fh, "\t" if path.suffix.lower() == ".tsv" else ",", cap)


def read_csv(path: Path, cap: int, column: str, id_column: str | None) -> Iterator[Record]:
    """The rows of a CSV/TSV file. Its header is read now: a header without ``column`` or
    ``id_column`` (or that cannot be read) is refused before any line is written."""
    fh = open(path, "rb")
    try:
        scanner = _csv_rows(path, fh, cap)
        rows = scanner.rows()
        first = next(rows, None)
        if first is None:
            fh.close()
            return iter(())
        if first.fields is None:
            raise InputError(f"{path}: unreadable CSV header: {first.error}", code=ec.INPUT_BAD_CSV)
        header = first.fields
        if column not in header:
            raise InputError(f"{path}: no column {column!r} (columns: {', '.join(header)[:300]})",
                             code=ec.INPUT_FIELD_MISSING)
        id_col: int | None
        if id_column:
            if id_column not in header:
                raise InputError(f"{path}: no id column {id_column!r}", code=ec.INPUT_FIELD_MISSING)
            id_col = header.index(id_column)
        else:       # the default: the ``id`` column when there is one (the --id-field help says so)
            id_col = header.index("id") if "id" in header else None
    except BaseException:
        fh.close()
        raise
    scanner.keep = id_col
    return _csv_records(fh, rows, header.index(column), column, id_col, image_base(path))


def _csv_records(fh, rows: Iterator[_CsvRow], col: int, column: str, id_col: int | None,
                 base: Path | None) -> Iterator[Record]:
    with fh:
        for i, r in enumerate(rows):
            if r.fields is None:                # over-long, or a quoted field that never closes: its id kept
                yield Record(i, r.id_cell or None, error=r.error, line=r.line)
                continue
            row = r.fields
            rid = row[id_col] if id_col is not None and id_col < len(row) and row[id_col] != "" else None
            if col >= len(row):
                yield Record(i, rid, error=InputError(f"row at line {r.line} has no {column!r} value",
                                                      code=ec.INPUT_FIELD_MISSING), line=r.line)
            else:
                yield Record(i, rid, _image_path(row[col], column, base), line=r.line)   # as JSONL's


def _image_entries(path: Path) -> list[tuple[str, Path, OSError | None]]:
    """(relative posix name, path, None) of every image, and (``sub/``, path, the error) of every
    subfolder that cannot be listed (its images are unknown), sorted by the relative name. A folder
    that cannot be listed itself raises ``InputError`` ``input_file_unreadable``."""
    entries: list[tuple[str, Path, OSError | None]] = []

    def unreadable(exc: OSError) -> None:
        where = Path(exc.filename) if exc.filename is not None else path
        if where == path:
            raise InputError(f"cannot read the image folder {path}: {exc.strerror or exc}",
                             code=ec.INPUT_FILE_UNREADABLE)
        entries.append((where.relative_to(path).as_posix() + "/", where, exc))

    for root, dirs, names in os.walk(path, onerror=unreadable):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        entries += [(f.relative_to(path).as_posix(), f, None) for f in (Path(root) / n for n in sorted(names)
                    if not n.startswith(".") and Path(n).suffix.lower() in IMAGE_SUFFIXES)]
    return sorted(entries, key=lambda t: t[0])


def image_files(path: Path) -> list[tuple[str, Path]]:
    """(relative posix name, path) of every image ``read_images`` yields, in its order (a subfolder that
    cannot be listed has no image here; ``read_images`` gives it an error record)."""
    return [(rel, f) for rel, f, exc in _image_entries(path) if exc is None]


def read_images(path: Path) -> Iterator[Record]:
    for i, (rel, f, exc) in enumerate(_image_entries(path)):
        if exc is None:
            yield Record(i, rel, str(f))
        else:       # its images are unknown: one record says so, rather than none and no count
            yield Record(i, rel, error=InputError(f"cannot list the folder {rel}: {exc.strerror or exc}; its "
                                                  f"images are not scored", code=ec.INPUT_FILE_UNREADABLE))


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
            for rel, f, exc in _image_entries(path):
                try:
                    if exc is not None:
                        raise exc
                    size, digest = _sha256_file(f)
                except OSError as err:  # its own error line (a dangling link, a loop, no permission): no job error
                    size, digest = -1, f"unreadable:{err.errno}"
                h.update(f"{rel}\0{size}\0{digest}\n".encode("utf-8", "surrogateescape"))
                total += max(size, 0)
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
    """The rows ``read_csv`` yields (its own scanner: a quoted field may span lines, an over-long row
    or an unclosed quote is one row, the lines after an unclosed quote are rows again)."""
    with open(path, "rb") as fh:
        return max(sum(1 for _ in _csv_rows(path, fh, cap).rows()) - 1, 0)     # the header is no record


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
