"""Input readers for ``edge-infer score``: JSONL, CSV, plain text, an image folder.

The format, unless given, is the suffix's (``detect_format``): ``.jsonl``, ``.ndjson`` and ``.json``
are JSONL, ``.csv`` and ``.tsv`` CSV, a folder images, anything else text. A Parquet file (``PAR1``
at both ends) is refused whatever the format (``input_invalid``): only ``--engine ray`` reads it.

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
``score_csv_scan._CsvScanner``. A CSV/TSV row with more fields than the header (a delimiter in an
unquoted text) is an ``input_bad_csv`` record, a header naming the field or id column twice is
refused (``score_csv``), and a JSONL line with its field or id member twice is ``input_bad_json``
(``score_jsonl._twice``). An image subfolder that cannot be listed is one
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
dropped; a UTF-16 or UTF-32 one refuses the input (``score_records.refuse_wide_bom``). The
input may be a pipe or a FIFO (``<(...)``, ``/dev/stdin``): it is
read once (``count_records`` says None rather than read it twice).

``input_fingerprint`` identifies an input for ``score --resume``: size and
sha256 of a file; for an image folder, the sha256 over the sorted relative
names, sizes and content hashes of the images the reader would yield.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Iterator

from . import error_codes as ec
from .errors import InputError
from .score_csv import _count_csv, read_csv
from .score_images import IMAGE_PATH_FIELDS, _image_entries, image_base, image_files, read_images
from .score_jsonl import _jsonl_lines, read_jsonl
from .score_records import Record, _lines, _Overlong, _too_long, refuse_wide_bom

FORMATS = ("jsonl", "csv", "text", "images")


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
    if suffix in (".jsonl", ".ndjson", ".json"):    # .json read as text scored each JSON line whole, "ok"
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    return "text"


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
    if path.is_file():      # refused before a line is written (a pipe: by its reader, on its first bytes)
        try:
            with open(path, "rb") as fh:
                head = fh.read(16)
                refuse_wide_bom(head, path)
                refuse_image(head, path, fmt)
                refuse_parquet(fh, head[:4], path, fmt)
        except OSError as exc:
            raise InputError(f"cannot read input {path}: {exc.strerror or exc}",
                             code=ec.INPUT_FILE_UNREADABLE) from None
    if fmt == "text":
        return RecordStream(read_text(path, cap), source)
    if fmt == "jsonl":
        return RecordStream(read_jsonl(path, cap, field, id_field), source)
    return RecordStream(read_csv(path, cap, field, id_field), source)


def image_kind(head: bytes) -> str | None:
    """The image format whose signature ``head`` (a file's first 16 bytes) starts with, else None. A
    BMP's ``BM`` counts only with its four reserved zero bytes (a text line may start with "BM")."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"BM") and head[6:10] == b"\0\0\0\0":
        return "BMP"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "WebP"
    if head[:4] in (b"II*\0", b"MM\0*"):
        return "TIFF"
    return None


def refuse_image(head: bytes, path: Path, fmt: str) -> None:
    """An image file given as the input (``score ART photo.jpg``) is no text, JSONL or CSV: read as
    text lines, its bytes were each an ``input_bad_encoding`` line (579 for bus.jpg, exit 2), and for a
    text model the runs that decoded as UTF-8 were scored ``ok``. Refused before any line
    (``input_invalid``), naming what reads images."""
    kind = image_kind(head)
    if kind is not None:
        raise InputError(f"{path} is a {kind} image, not a {fmt} input: score and shadow read images from a folder "
                         f"(edge-infer score ART FOLDER) or by path from a JSONL field or CSV column "
                         f"({', '.join(IMAGE_PATH_FIELDS)}); one image runs with edge-infer infer ART --image {path}",
                         code=ec.INPUT_INVALID)


def refuse_parquet(fh, head: bytes, path: Path, fmt: str) -> None:
    """A Parquet file (``PAR1`` at both ends) is no text, JSONL or CSV: read as lines, the runs of its
    bytes that decoded as UTF-8 were scored ``ok`` (exit 0). Only ``--engine ray`` reads Parquet."""
    if head != b"PAR1":
        return
    fh.seek(0, os.SEEK_END)
    if fh.tell() < 8:
        return
    fh.seek(-4, os.SEEK_END)
    if fh.read(4) == b"PAR1":
        raise InputError(f"{path} is a Parquet file, not {fmt}: only --engine ray reads Parquet (--format parquet); "
                         f"the local engine reads JSONL, CSV/TSV, text or an image folder", code=ec.INPUT_INVALID)


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
