"""The load path's records (``edge_runtime.value``): what ``@dataclass`` gave them, without
its per-class code generation at import (11 ms of every process start, 2-core AMD EPYC with AVX-512 VNNI)."""

import copy
import dataclasses
import pickle

import numpy as np
import pytest

from edge_runtime.devices.base import Capabilities, Suitability
from edge_runtime.devices.options import DeviceOptions, Option
from edge_runtime.error_codes import CODES, Code
from edge_runtime.limits import DEFAULT_LIMITS, Limits
from edge_runtime.models.results import Prepared, Scores, TaskOutput
from edge_runtime.result import InferenceResult
from edge_runtime.selection import POLICY, Choice
from edge_runtime.value import Frozen, Record

FROZEN = [Suitability("cpu", "x:cpu", "why", 3, "rule"), Capabilities(inline=True), Option("threads", int, 2),
          DeviceOptions({"a": 1}), Limits(max_batch_items=7), Code("c", "input", "m"), POLICY[0][0],
          Choice({"target": "t"}, "x", Suitability("cpu", "x:cpu", "why"))]


def test_fields_are_the_init_parameters_in_order():
    assert Suitability.FIELDS == ("tier", "device", "reason", "score", "policy")
    assert Limits.FIELDS[0] == "max_request_bytes" and len(Limits.FIELDS) == 8
    assert Prepared.FIELDS == ("bucket", "feeds", "truncated", "length", "meta")
    assert InferenceResult.FIELDS[:3] == ("prediction", "scores", "embedding") and len(InferenceResult.FIELDS) == 18


@pytest.mark.parametrize("rec", FROZEN, ids=lambda r: type(r).__name__)
def test_frozen_records_refuse_changes_compare_hash_copy_and_pickle_by_value(rec):
    name = rec.FIELDS[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(rec, name, "other")
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(rec, name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.new_attribute = 1
    twin = type(rec)(**rec.fields_dict())
    assert twin == rec and twin is not rec and not (twin != rec)
    if all(isinstance(v, (str, int, float, bool, type(None), tuple, type)) or callable(v)
           for v in rec.fields_dict().values()):
        assert hash(twin) == hash(rec) and len({twin, rec}) == 1
    for other in (copy.copy(rec), copy.deepcopy(rec), pickle.loads(pickle.dumps(rec))):
        assert other == rec and type(other) is type(rec)
    assert rec != object() and rec.__eq__(object()) is NotImplemented
    assert repr(rec).startswith(f"{type(rec).__qualname__}({name}=")


def test_replace_makes_a_new_record_and_refuses_unknown_fields():
    s = Suitability("cpu", "x:cpu", "why")
    t = s.replace(score=5, policy="p")
    assert (t.score, t.policy, t.reason) == (5, "p", "why") and (s.score, s.policy) == (0, None)
    with pytest.raises(TypeError, match="no field bogus"):
        s.replace(bogus=1)
    assert DEFAULT_LIMITS.merged({"max_batch_items": 3}).max_batch_items == 3
    assert Limits().to_dict() == dict(zip(Limits.FIELDS, (2 << 20, 500, 10_000, 20 << 20, 40_000_000, 5_000, 32, 300)))


def test_mutable_records_are_unhashable_and_equal_by_fields():
    a, b = Prepared(0, {}, length=3), Prepared(0, {}, length=3)
    assert a == b and a != Prepared(1, {}) and not isinstance(a, Frozen) and isinstance(a, Record)
    with pytest.raises(TypeError):
        hash(a)
    a.meta = {"x": 1}                      # mutable, as a plain dataclass was
    assert a != b and a.meta == {"x": 1}


def test_task_output_and_result_take_class_id_top_k_and_raw_from_what_the_task_returned():
    scores = Scores({"cat": 0.9}, class_id=3, top_k=[{"index": 3, "label": "cat", "score": 0.9}])
    out = TaskOutput(prediction="cat", scores=scores)
    assert out.class_id == 3 and out.top_k == scores.top_k and out.raw_outputs is None and TaskOutput().scores == {}
    assert TaskOutput(scores=scores, class_id=1).class_id == 1
    kw = dict(prediction="cat", scores=scores, embedding=None, latency_ms=1.0, device="d", target="t", model="m",
              version="1", trace_id="x", bucket="static", outputs={"y": np.zeros(2)})
    r = InferenceResult(**kw)
    assert r.class_id == 3 and r.top_k == scores.top_k
    assert r == InferenceResult._make({**kw, **{f: None for f in ("class_id", "top_k", "raw_outputs", "input_length",
                                                                   "detections", "keypoints")}, "truncated": False})
    assert "outputs=" not in repr(r) and "raw_outputs" not in repr(r) and "class_id=3" in repr(r)
    assert r.to_dict()["class_id"] == 3 and r.fields_dict()["outputs"] is kw["outputs"]


def test_every_error_code_is_a_frozen_code():
    assert CODES and all(isinstance(c, Code) and c.code == k for k, c in CODES.items())
