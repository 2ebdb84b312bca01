"""#16 item 6: after parsing and validation nothing an artifact says can be changed.

The manifest (variants, buckets, tensor specs, every section) is read-only JSON,
the Artifact and the device Choice are frozen records, and so is the hardware
record; reading, equality and JSON output are exactly those of plain JSON."""

import copy
import dataclasses
import json
import pickle

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime import hardware as hw
from edge_runtime.artifact import load_artifact
from edge_runtime.frozen import FrozenDict, FrozenList, freeze, thaw


def _mutations(m):
    v = m["variants"][0]
    b = v["buckets"][0]
    t = b["inputs"][0]
    return {
        "top-level key": lambda: m.__setitem__("task", "tensors"),
        "section update": lambda: m["model"].update(version="2"),
        "variant list": lambda: m["variants"].append({}),
        "variant field": lambda: v.__setitem__("target", "x"),
        "variant pop": lambda: v.pop("buckets"),
        "bucket list": lambda: v["buckets"].insert(0, b),
        "bucket field": lambda: b.__setitem__("file", "other.onnx"),
        "tensor shape item": lambda: t["shape"].__setitem__(0, 7),
        "tensor shape extend": lambda: t["shape"].extend([1]),
        "tensor dtype": lambda: t.__setitem__("dtype", "float64"),
        "files entry": lambda: m["files"].clear(),
        "in-place or": lambda: m["model"].__ior__({"name": "x"}),
    }


def test_every_part_of_a_loaded_manifest_is_read_only(make_artifact):
    art = make_artifact("tensors")
    with er.load(art) as rt:
        m = rt.artifact.manifest
        before = json.dumps(m, sort_keys=True)
        for what, mutate in _mutations(m).items():
            with pytest.raises(TypeError, match="read-only"):
                mutate()
        assert json.dumps(m, sort_keys=True) == before            # nothing changed by the attempts
        assert rt.variant is rt.choice.variant and isinstance(rt.variant, FrozenDict)
        assert rt.task.buckets is rt.variant["buckets"]            # the task reads the same frozen buckets
        rt.infer({t["name"]: np.zeros(t["shape"], t["dtype"])
                  for t in rt.variant["buckets"][0]["inputs"]})   # and still serves


def test_artifact_choice_and_hardware_are_frozen_records(make_artifact):
    art = make_artifact("tensors")
    with er.load(art) as rt:
        assert rt.artifact.verified and rt.info()["verify_ms"] >= 0
        with pytest.raises(dataclasses.FrozenInstanceError):
            rt.artifact.verified = False
        with pytest.raises(dataclasses.FrozenInstanceError):
            rt.choice.fallback = "edited"
        with pytest.raises(TypeError, match="read-only"):
            rt.hardware["cpu"] = {}
    loaded = load_artifact(art)
    assert loaded.verified and isinstance(loaded.manifest, FrozenDict)
    assert not load_artifact(art, verify=False).verified
    record = hw.detect()
    with pytest.raises(TypeError, match="read-only"):
        record.setdefault("jetson", {"model": "fake"})


def test_frozen_json_reads_compares_and_serialises_as_plain_json():
    raw = {"a": [1, {"shape": [1, 3]}], "b": {"c": None, "d": "x"}}
    f = freeze(raw)
    assert f == raw and f["a"][1]["shape"] == [1, 3] and isinstance(f, dict) and isinstance(f["a"], list)
    assert json.dumps(f) == json.dumps(raw)
    assert f["a"] + [2] == [1, {"shape": [1, 3]}, 2]               # new values are plain
    for derived in (thaw(f), copy.deepcopy(f), pickle.loads(pickle.dumps(f))):
        assert derived == raw and type(derived) is dict and type(derived["a"]) is list
        derived["a"][1]["shape"].append(9)                           # a derived copy is the caller's to change
    assert f["a"][1]["shape"] == [1, 3]
    assert type(copy.copy(f)) is dict and isinstance(copy.copy(f)["a"], FrozenList)   # shallow: nested stay frozen


def test_the_manifest_parses_into_typed_records_that_equal_the_json(make_artifact):
    from edge_runtime.records import Bucket, Manifest, TensorSpec, Variant

    art = make_artifact("text-classification")
    raw = json.loads((art / "manifest.json").read_text())
    with er.load(art, device="fake") as rt:
        m = rt.artifact.manifest
        assert isinstance(m, Manifest) and m == raw                     # the same JSON, read-only and typed
        assert m.task == raw["task"] and m.name == raw["model"]["name"] and m.version == raw["model"]["version"]
        v = rt.variant
        assert isinstance(v, Variant) and v.target == raw["variants"][0]["target"]
        assert [b.name for b in v.buckets] == [b["name"] for b in raw["variants"][0]["buckets"]]
        b = v.buckets[0]
        assert isinstance(b, Bucket) and b.file == raw["variants"][0]["buckets"][0]["file"]
        t = b.inputs[0]
        assert isinstance(t, TensorSpec) and t.shape == tuple(raw["variants"][0]["buckets"][0]["inputs"][0]["shape"])
        assert t.dtype == "int64" and t.quantization is None and isinstance(b.outputs[0], TensorSpec)
        assert v.runtime == raw["variants"][0].get("runtime", {}) and v.parity == raw["variants"][0]["parity"]
        with pytest.raises(AttributeError):
            t.shape = (1, 2)          # properties: no setter
        assert json.loads(json.dumps(m)) == raw


def test_the_hardware_record_is_typed():
    from edge_runtime.records import CpuInfo, Hardware

    h = hw.detect()
    assert isinstance(h, Hardware) and isinstance(h.cpu, CpuInfo)
    assert h.cpu.int8_dot == bool(h["cpu"].get("int8_dot")) and h.cpu.features == tuple(h["cpu"]["features"])
    assert h.system == h["system"] and h.machine == h["machine"] and h.edgetpus == h["edgetpus"]
    assert json.loads(json.dumps(h)) == json.loads(json.dumps(dict(h)))
