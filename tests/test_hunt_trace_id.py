"""A caller's ``trace_id`` was taken as given: an int came back as the result's trace id (``"trace_id": 5``
in JSON, not a string), and a 10,000-character or multi-line one was carried into every log line and record.
Now a printable string of at most 256 characters, else ``input_invalid`` (counted as the call's error)."""

from __future__ import annotations

import pytest

import edge_runtime as er
from edge_runtime.result import MAX_TRACE_ID


@pytest.mark.parametrize("bad", [5, b"abc", "x" * (MAX_TRACE_ID + 1), "a\nb", "tab\there",
                                 "", "   "])     # blank: an id that correlates nothing (before 2026-12-07, ours)
def test_a_trace_id_that_is_no_printable_string_is_refused(make_artifact, bad):
    with er.load(make_artifact(), device="fake") as rt:
        with pytest.raises(er.InputError) as ei:
            rt.infer("good film", trace_id=bad)
        assert ei.value.code == "input_invalid" and "trace_id" in str(ei.value)
        assert {e["code"]: e["count"] for e in rt.metrics()["errors"]} == {"input_invalid": 1}


@pytest.mark.parametrize("good", ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "req 42", "x" * MAX_TRACE_ID])
def test_a_printable_trace_id_comes_back_as_given(make_artifact, good):
    with er.load(make_artifact(), device="fake") as rt:
        assert rt.infer("good film", trace_id=good).trace_id == good
        assert len(rt.infer("good film").trace_id) == 32          # none given: ours
