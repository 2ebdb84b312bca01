"""The text of a score output line (``score_lines._text``): orjson when installed, the standard
library otherwise; both must read back to the values ``json.dumps(default=str)`` writes, and
both must refuse NaN and infinity anywhere in the line."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_runtime import score_lines

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(np.float32),
    st.floats(allow_nan=False, allow_infinity=False).map(np.float64),
    st.integers(min_value=-(2 ** 62), max_value=2 ** 62).map(np.int64))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=6), inner, max_size=6)), max_leaves=30)


@pytest.fixture(params=["orjson", "json"])
def writer(request, monkeypatch):
    if request.param == "json":
        monkeypatch.setattr(score_lines, "_orjson", None)
    elif score_lines._orjson is None:
        pytest.fail("orjson is in the dev extras (serve): it must be importable here")
    return request.param


@settings(max_examples=300, deadline=None)
@given(line=st.dictionaries(st.text(max_size=8), values, max_size=6))
def test_both_writers_read_back_as_json_dumps_default_str(line):
    want = json.loads(json.dumps(line, default=str))
    for orjson in (score_lines._orjson, None):
        saved, score_lines._orjson = score_lines._orjson, orjson
        try:
            text = score_lines._text(line)
        finally:
            score_lines._orjson = saved
        assert text is not None and "\n" not in text
        assert json.loads(text) == want


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float64("nan"), np.float32("inf")])
@pytest.mark.parametrize("where", ["top", "list", "nested", "top_k"])
def test_nan_or_infinity_anywhere_is_refused(writer, bad, where):
    emb = [0.5] * 10
    line = {"ok": True, "result": {"embedding": emb, "scores": {"a": 0.25},
                                   "top_k": [{"index": 1, "score": 0.5}]}}
    if where == "top":
        line["result"]["latency_ms"] = bad
    elif where == "list":
        emb[3] = bad
    elif where == "nested":
        line["result"]["scores"]["a"] = bad
    else:
        line["result"]["top_k"][0]["score"] = bad
    assert score_lines._text(line) is None


def test_a_sum_that_overflows_is_not_mistaken_for_infinity(writer):
    line = {"result": {"embedding": [1e308, 1e308, -1e308], "box": [[1e308, 1e308]]}}
    assert json.loads(score_lines._text(line)) == line


def test_a_lone_surrogate_and_a_huge_int_are_written_by_the_standard_library(writer):
    line = {"id": 2 ** 80, "text": "a\udcff"}
    text = score_lines._text(line)
    assert text == json.dumps(line, ensure_ascii=False, separators=(",", ":"))
