"""Parquet in and out for ``edge-infer score --engine ray`` (pyarrow, which ``ray[data]`` brings).

Input: a Parquet file (or a folder of them, in name order; Parquet files in its
subfolders, a partitioned dataset, are refused, ``input_invalid``) read a row group at a
time; ``Record(index, id, value, error, line)`` with ``line`` the 1-based row
number across the files, ``id`` the ``--id-field`` column (default ``id`` when
a file has it, and then every file must, else null), the value the ``--field`` column (bytes for a binary column:
an encoded image; a list for a list column). A row whose field is null gets an
``input_field_missing`` error row, as a JSONL record without the field does; one whose
value no JSON record could hold (a date, time, decimal, nested bytes) an ``input_wrong_type``
error row, never its ``str`` scored.

Output: the run writes its JSONL journal (``OUT.journal.jsonl``, with local score's
contract: job record, ``--resume``, exactly once) and, when every input has its
line, converts it to ``OUT`` atomically (a temporary file, then rename), a row
group per 10,000 lines. Columns: ``index`` int64, ``id`` string (a non-string id
as its JSON text), ``line`` int64, ``ok`` bool, ``result`` string (the result
object as JSON: results are nested and differ by task), ``error_type``,
``error_code``, ``error_message`` strings (null on ok rows). A lone surrogate (an
undecodable input byte kept in an id) is its ``\\udXXX`` escape in every string
column, as the JSONL line spells it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Iterator

from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError
from .score_inputs import Record, RecordStream
from .score_lines import _utf8_safe

PARQUET_SUFFIXES = (".parquet", ".pq")


def is_parquet(path) -> bool:
    p = Path(path)
    if p.is_dir():      # a partitioned dataset holds its files in subfolders only: Parquet too (and refused)
        return any(f.suffix.lower() in PARQUET_SUFFIXES for f in p.rglob("*"))
    return p.suffix.lower() in PARQUET_SUFFIXES


def _files(path: Path) -> list[Path]:
    """A file, or a folder's Parquet files in name order. A folder with Parquet files in a subfolder (a
    partitioned dataset, ``year=2026/part-0.parquet``) is refused: its rows would be skipped (the count and
    the fingerprint too) and the run end with exit 0 and records lost."""
    if path.is_dir():
        nested = sorted(f for f in path.rglob("*") if f.suffix.lower() in PARQUET_SUFFIXES and f.parent != path)
        if nested:
            raise InputError(f"{path}: Parquet files in subfolders ({nested[0].relative_to(path)}"
                             f"{f' and {len(nested) - 1} more' if len(nested) > 1 else ''}) are not read: a folder "
                             f"input is its own Parquet files only; point at one folder of files, or write the "
                             f"dataset without partitions (an image folder: --format images)", code=ec.INPUT_INVALID)
        return sorted(f for f in path.iterdir() if f.suffix.lower() in PARQUET_SUFFIXES and f.is_file())
    return [path]


def parquet_fingerprint(path) -> dict:
    """``input_fingerprint``'s form for a Parquet file or folder (names, sizes, sha256)."""
    path = Path(path)
    h, total, files = hashlib.sha256(), 0, _files(path)
    for f in files:
        d = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                d.update(block)
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0{d.hexdigest()}\n".encode("utf-8", "surrogateescape"))
        total += size
    return {"kind": "folder" if path.is_dir() else "file", "format": "parquet", "files": len(files), "bytes": total,
            "sha256": h.hexdigest()}


def count_parquet(path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in _files(Path(path)))


def _id(v):
    """A cell of the id column as the record's id: a scalar as it is, a binary cell as its text (UTF-8; an
    undecodable byte kept as a lone surrogate, as the CSV reader keeps it), a date, time or decimal as its
    ``str``; a list or struct as its JSON text (cut at 200 characters, as the JSONL reader cuts one)."""
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "surrogateescape")
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, default=str)[:200]
    return str(v)


def _plain(t, top: bool = True) -> bool:
    """Whether an Arrow column type holds what a JSON record could (bytes at the top: an encoded image),
    decided once per batch, not per value (a list column of 150k floats a row). A date, time, decimal or
    nested bytes reached the actors as its ``str`` (a date column scored as the text "2026-01-01", exit 0,
    where a JSONL number is refused): not plain."""
    import pyarrow.types as pt

    if pt.is_string(t) or pt.is_large_string(t) or pt.is_integer(t) or pt.is_floating(t) or pt.is_boolean(t) \
            or pt.is_null(t):
        return True
    if pt.is_binary(t) or pt.is_large_binary(t) or pt.is_fixed_size_binary(t):
        return top
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        return _plain(t.value_type, False)
    if pt.is_dictionary(t):
        return _plain(t.value_type, top)
    if pt.is_struct(t):
        return all(_plain(t.field(i).type, False) for i in range(t.num_fields))
    return False


def _records(path: Path, field: str, id_field: str | None) -> Iterator[Record]:
    import pyarrow.parquet as pq

    index = 0
    files = _files(path)
    # the default id column is decided once for the whole input: a folder whose first file has ``id`` and a
    # later one not (or the other way round) would give that file's rows null ids, silently
    idc = id_field or ("id" if any("id" in pq.ParquetFile(f).schema_arrow.names for f in files) else None)
    for f in files:
        pf = pq.ParquetFile(f)
        names = pf.schema_arrow.names
        if field not in names:
            raise InputError(f"{f}: no column {field!r} (columns: {', '.join(names)[:300]})",
                             code=ec.INPUT_FIELD_MISSING)
        if idc is not None and idc not in names:
            why = "" if id_field else " (another file of this folder has one: every file needs it, or none)"
            raise InputError(f"{f}: no id column {idc!r}{why}", code=ec.INPUT_FIELD_MISSING)
        cols = [field] + ([idc] if idc and idc != field else [])
        for batch in pf.iter_batches(columns=cols, batch_size=4096):
            values = batch.column(field).to_pylist()
            plain = _plain(batch.schema.field(field).type)
            ids = batch.column(idc).to_pylist() if idc else [None] * len(values)
            for v, rid in zip(values, ids):
                if v is None:
                    yield Record(index, _id(rid), error=InputError(f"row {index + 1} has no {field!r} value",
                                                                   code=ec.INPUT_FIELD_MISSING), line=index + 1)
                elif not plain:
                    yield Record(index, _id(rid), error=InputError(
                        f"row {index + 1}: the {field!r} column is {batch.schema.field(field).type}, whose values "
                        f"({type(v).__name__}) are no text, number, bytes or list of them; cast the column",
                        code=ec.INPUT_WRONG_TYPE), line=index + 1)
                else:
                    yield Record(index, _id(rid), v, line=index + 1)
                index += 1


def read_parquet_records(path, *, field: str, id_field: str | None = None) -> RecordStream:
    path = Path(path)
    if not path.exists():
        raise InputError(f"input {path} does not exist", code=ec.INPUT_MISSING)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise EdgeRuntimeError("Parquet input needs pyarrow: pip install 'edge-runtime[ray]'",
                         code=ec.DEPENDENCY_MISSING) from None
    source = {"path": str(path), "format": "parquet", "field": field, "id_field": id_field or "id"}
    return RecordStream(_records(path, field, id_field), source)


def _utf8(text: str | None) -> str | None:
    """``text`` as a Parquet string can hold it (strict UTF-8): each lone surrogate as its JSON escape
    ``\\udXXX``, as the JSONL line writes it (``score_lines._utf8_safe``)."""
    return None if text is None else _utf8_safe(text)


def jsonl_to_parquet(journal: Path, out: Path, rows_per_group: int = 10_000) -> int:
    """Write the JSONL ``journal`` as Parquet ``out`` (atomically); return the rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("index", pa.int64()), ("id", pa.string()), ("line", pa.int64()), ("ok", pa.bool_()),
                        ("result", pa.string()), ("error_type", pa.string()), ("error_code", pa.string()),
                        ("error_message", pa.string())])
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    n = 0
    cols: dict[str, list] = {k: [] for k in schema.names}

    def flush(writer):
        writer.write_table(pa.table(cols, schema=schema))
        for v in cols.values():
            v.clear()

    with pq.ParquetWriter(tmp, schema) as writer, open(journal, "rb") as fh:
        for raw in fh:
            line = json.loads(raw)
            err = line.get("error") or {}
            rid = line.get("id")
            cols["index"].append(line["index"])
            cols["id"].append(_utf8(rid if rid is None or isinstance(rid, str) else json.dumps(rid)))
            cols["line"].append(line.get("line"))
            cols["ok"].append(bool(line.get("ok")))
            cols["result"].append(_utf8(json.dumps(line["result"], ensure_ascii=False)) if line.get("ok") else None)
            cols["error_type"].append(_utf8(err.get("type")))
            cols["error_code"].append(_utf8(err.get("code")))
            cols["error_message"].append(_utf8(err.get("message")))
            n += 1
            if len(cols["index"]) >= rows_per_group:
                flush(writer)
        if cols["index"] or n == 0:
            flush(writer)
    os.replace(tmp, out)
    return n


def absolute_paths(records: Iterable[Record]) -> Iterator[Record]:
    """An image task's records, each relative path made absolute in the driver, from its working directory,
    where local ``score`` opens it (a JSONL ``image``/``path``/``file`` path is already joined to its file's
    folder by the reader). An actor opens a path from its own working directory, where its node's ``ray start``
    ran, never the driver's: a relative path scored another node's file of that name, or another folder's,
    with exit 0 (the artifact's path was already made absolute)."""
    cwd = os.getcwd()
    for r in records:
        if r.error is None and isinstance(r.value, str) and r.value and not os.path.isabs(r.value):
            r.value = os.path.join(cwd, r.value)
        yield r
