"""Wrong answers hunted in the Ray Data path (``--engine ray``): records mislabelled with exit 0.

Reader-level tests: no Ray is started (the records the driver hands to Ray are checked directly).
"""

from __future__ import annotations

import pytest

from edge_runtime import error_codes as ec
from edge_runtime.errors import InputError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _write(path, cols: dict):
    pq.write_table(pa.table(cols), path)


@pytest.mark.parametrize("with_id_first", [True, False])
def test_a_folder_whose_files_disagree_on_the_id_column_is_refused(tmp_path, with_id_first):
    """A folder of Parquet files, the default id column ``id`` in one file and not in another: the rows of
    the file without it got null ids (exit 0, the ids of those records lost, or the other file's ids
    dropped); now the file without it is refused, typed, naming it."""
    from edge_runtime.ray_io import read_parquet_records

    a, b = tmp_path / "part-0.parquet", tmp_path / "part-1.parquet"
    with_id, without = (a, b) if with_id_first else (b, a)
    _write(with_id, {"id": ["x0", "x1"], "text": ["hello", "world"]})
    _write(without, {"text": ["more", "text"]})
    with pytest.raises(InputError) as err:
        list(read_parquet_records(tmp_path, field="text"))
    assert err.value.code == ec.INPUT_FIELD_MISSING and without.name in err.value.message


def test_a_folder_without_any_id_column_still_reads_with_null_ids(tmp_path):
    from edge_runtime.ray_io import read_parquet_records

    _write(tmp_path / "part-0.parquet", {"text": ["a", "b"]})
    _write(tmp_path / "part-1.parquet", {"text": ["c"]})
    recs = list(read_parquet_records(tmp_path, field="text"))
    assert [(r.index, r.id, r.value, r.line) for r in recs] == [(0, None, "a", 1), (1, None, "b", 2), (2, None, "c", 3)]


def test_a_date_or_decimal_column_is_a_typed_error_row_not_its_text_scored(tmp_path):
    """A ``text`` column of Parquet dates or decimals: the values crossed to the actors as their ``str``
    (``to_rows``' JSON ``default=str``), so a text model scored "2026-01-02" and "12.50": ok lines, exit 0,
    where a JSONL number is refused. Now each such row is an ``input_wrong_type`` error row (id and line
    kept), and plain cells beside them still score."""
    import datetime
    import decimal
    import json

    from edge_runtime.ray import to_rows
    from edge_runtime.ray_io import read_parquet_records

    _write(tmp_path / "d.parquet", {"id": ["a", "b"], "text": pa.array([datetime.date(2026, 1, 2), None])})
    _write(tmp_path / "m.parquet", {"id": ["c"], "text": pa.array([decimal.Decimal("12.50")])})
    _write(tmp_path / "s.parquet", {"id": ["d"], "text": ["fine"]})
    recs = list(read_parquet_records(tmp_path, field="text"))
    assert [(r.index, r.id, r.line) for r in recs] == [(0, "a", 1), (1, "b", 2), (2, "c", 3), (3, "d", 4)]
    assert [r.error.code if r.error else None for r in recs] == [
        ec.INPUT_WRONG_TYPE, ec.INPUT_FIELD_MISSING, ec.INPUT_WRONG_TYPE, None]
    assert "date32" in recs[0].error.message and recs[3].value == "fine"
    metas = [json.loads(row["meta"]) for row in to_rows(recs)]
    assert [m["value"] for m in metas] == [None, None, None, "fine"]


def test_ray_failing_mid_run_is_typed_and_keeps_the_written_lines(tmp_path, monkeypatch):
    """Ray itself failing mid-run (an object store out of memory, an actor past its restarts) came out of
    ``score_ray`` as Ray's own exception: the CLI's ``unexpected`` "a bug" report, exit 1. Now an
    ``InferenceRuntimeError`` (``inference_failed``) that says how many lines the output keeps and to
    ``--resume``; the lines written before the failure stay, in order. (No Ray is started: the
    dataset is a stand-in that yields one block and then raises Ray's error.)"""
    ray = pytest.importorskip("ray")
    import json

    import numpy as np

    from edge_runtime.errors import InferenceRuntimeError
    from edge_runtime.score import Summary
    from edge_runtime.score_inputs import Record
    from edge_runtime.score_ray import OrderedWriter, _run

    def line(i):
        return json.dumps({"index": i, "id": f"r{i}", "line": i + 1, "ok": False,
                           "error": {"type": "InputError", "code": "input_invalid", "message": "x"}})

    class FakeDs:
        def map_batches(self, *a, **kw):
            return self

        def iter_batches(self, **kw):
            yield {"index": np.array([0, 1]), "text": np.array([line(0), line(1)], dtype=object)}
            raise ray.exceptions.ObjectStoreFullError("object store is full")

    monkeypatch.setattr(ray.data, "from_items", lambda *a, **kw: FakeDs())
    out = tmp_path / "out.jsonl"
    with open(out, "wb") as fh:
        writer = OrderedWriter(fh, 0, Summary(batch_size=2), owned=True)
        with pytest.raises(InferenceRuntimeError) as err:
            _run([Record(i, f"r{i}", "t", None, i + 1) for i in range(4)], writer, artifact="a", seal=None,
                 device="cpu", target="t", strict=False, device_options=None, deadline_ms=None, batch_size=2,
                 actors=1, cpus_per_actor=1, verify=False)
    assert err.value.code == ec.INFERENCE_FAILED and "--resume" in err.value.message
    assert "ObjectStoreFullError" in err.value.message and "2 lines" in err.value.message
    assert [json.loads(x)["index"] for x in out.read_text().splitlines()] == [0, 1]


@pytest.mark.parametrize("cpus", [float("nan"), float("inf")])
def test_a_cpus_per_actor_that_is_no_number_is_refused_before_anything_starts(tmp_path, cpus):
    """``--cpus-per-actor nan`` (click's float takes it) passed the ``<= 0`` check, and ``inf`` with
    ``--address`` skipped the local fit check: Ray's own error came out later, untyped. Now both are
    ``input_invalid`` before the artifact is even opened (so the missing one here is not reached)."""
    from edge_runtime.score_ray import score_ray

    with pytest.raises(InputError) as err:
        score_ray(tmp_path / "no-artifact", tmp_path / "in.jsonl", tmp_path / "out.jsonl", cpus_per_actor=cpus,
                  address="auto")
    assert err.value.code == ec.INPUT_INVALID and "--cpus-per-actor" in err.value.message
