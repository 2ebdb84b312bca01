"""The CSV/TSV reader of ``edge-infer score``: the header, then one record a row of
``_CsvScanner`` (``score_csv_scan``). See ``score_inputs``."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from . import error_codes as ec
from .errors import InputError
from .score_csv_scan import _CsvRow, _CsvScanner
from .score_images import _image_path, image_base
from .score_records import Record


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
        _once(path, header, column, "column")
        id_col: int | None
        if id_column:
            if id_column not in header:
                raise InputError(f"{path}: no id column {id_column!r}", code=ec.INPUT_FIELD_MISSING)
            id_col = header.index(id_column)
        else:       # the default: the ``id`` column when there is one (the --id-field help says so)
            id_col = header.index("id") if "id" in header else None
        if id_col is not None:
            _once(path, header, header[id_col], "id column")
    except BaseException:
        fh.close()
        raise
    scanner.keep = id_col
    return _csv_records(fh, rows, header.index(column), column, id_col, image_base(path), len(header))


def _once(path: Path, header: list[str], name: str, what: str) -> None:
    """Refuse a header that names the input or id column twice: which one is meant is unclear (``csv``'s
    DictReader takes the last, ``header.index`` the first: a silently different text or id)."""
    at = [i + 1 for i, h in enumerate(header) if h == name]
    if len(at) > 1:
        raise InputError(f"{path}: the header names {what} {name!r} {len(at)} times (columns "
                         f"{', '.join(map(str, at))}): which one is meant is unclear; rename the others",
                         code=ec.INPUT_BAD_CSV)


def _csv_records(fh, rows: Iterator[_CsvRow], col: int, column: str, id_col: int | None,
                 base: Path | None, width: int) -> Iterator[Record]:
    with fh:
        for i, r in enumerate(rows):
            if r.fields is None:                # over-long, or a quoted field that never closes: its id kept
                yield Record(i, r.id_cell or None, error=r.error, line=r.line)
                continue
            row = r.fields
            if len(row) > width:    # a delimiter in an unquoted field: every cell after it is shifted
                rid = row[0] if id_col == 0 and row[0] != "" else None      # nothing before the first can shift it
                yield Record(i, rid, error=InputError(
                    f"row at line {r.line} has {len(row)} fields, the header {width}: a delimiter in an unquoted "
                    f"field? quote that field; which cell is which cannot be told", code=ec.INPUT_BAD_CSV), line=r.line)
                continue
            rid = row[id_col] if id_col is not None and id_col < len(row) and row[id_col] != "" else None
            if col >= len(row):
                yield Record(i, rid, error=InputError(f"row at line {r.line} has no {column!r} value",
                                                      code=ec.INPUT_FIELD_MISSING), line=r.line)
            else:
                yield Record(i, rid, _image_path(row[col], column, base), line=r.line)   # as JSONL's


def _count_csv(path: Path, cap: int) -> int:
    """The rows ``read_csv`` yields (its own scanner: a quoted field may span lines, an over-long row
    or an unclosed quote is one row, the lines after an unclosed quote are rows again)."""
    with open(path, "rb") as fh:
        return max(sum(1 for _ in _csv_rows(path, fh, cap).rows()) - 1, 0)     # the header is no record
