"""The bounded CSV/TSV scanner of ``edge-infer score`` (``_CsvScanner``): rows as ``csv`` reads
them, an over-long row or an unclosed quoted field one error row with its id. See ``score_inputs``."""

from __future__ import annotations

import codecs
import csv
import re
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator

from . import error_codes as ec
from .errors import InputError
from .score_records import refuse_wide_bom

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
        refuse_wide_bom(block, getattr(self.fh, "name", "the input"))
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
