"""A bucket's first outputs against the manifest (edge_runtime/output_contract.py), and a JSON boolean
among the numbers of a tensors input: both were read as something else and answered with exit 0."""

from __future__ import annotations

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime.output_contract import output_problems


def _wrap_runs(monkeypatch, change):
    """Every fake session's outputs go through ``change(bucket_name, outputs)``."""
    import fake_backend

    opened = fake_backend.FakeBackend.open

    def open_(self, model_path, bucket, sub, options):
        sess = opened(self, model_path, bucket, sub, options)
        run = sess._run
        sess._run = lambda feeds, cancel: change(bucket["name"], run(feeds, cancel))
        return sess

    monkeypatch.setattr(fake_backend.FakeBackend, "open", open_)


def _as_codes(name, outs):
    return {k: np.clip(v * 10, -128, 127).astype(np.int8) for k, v in outs.items()}


def test_integer_codes_where_the_manifest_says_float_are_refused_at_load(make_artifact, monkeypatch):
    """Before: int8 logits went through softmax as if they were real values, every answer 'succeeded'."""
    _wrap_runs(monkeypatch, _as_codes)
    art = make_artifact("text-classification", buckets=(8, 16))
    with pytest.raises(er.ArtifactError) as ei:
        er.load(art, device="fake")
    assert ei.value.code == "output_contract_mismatch"
    assert "integer codes would be read as real values" in str(ei.value) and "'logits'" in str(ei.value)


def test_without_warmup_the_first_call_of_each_bucket_is_refused(make_artifact, monkeypatch):
    _wrap_runs(monkeypatch, lambda b, outs: _as_codes(b, outs) if b == "seq16" else outs)
    art = make_artifact("text-classification", buckets=(8, 16))
    with er.load(art, device="fake", warmup=False) as rt:
        assert rt.infer("hi").prediction in ("negative", "positive")      # seq8 keeps the contract
        long_text = "a much longer text than eight tokens fits in here"
        with pytest.raises(er.ArtifactError) as ei:
            rt.infer(long_text)
        assert ei.value.code == "output_contract_mismatch" and "seq16" in str(ei.value)
        batch = rt.infer_batch(["hi", long_text])
        assert batch[0].prediction in ("negative", "positive")
        assert isinstance(batch[1], er.ArtifactError) and batch[1].code == "output_contract_mismatch"
        with pytest.raises(er.ArtifactError):       # never a result later either: the flag stays unset
            rt.infer(long_text)


def test_a_missing_output_or_another_element_count_is_refused(make_artifact, monkeypatch):
    _wrap_runs(monkeypatch, lambda b, outs: {k: np.zeros(5, np.float32) for k in outs})
    with pytest.raises(er.ArtifactError, match="has 5 elements"):
        er.load(make_artifact("text-classification"), device="fake")
    monkeypatch.undo()
    _wrap_runs(monkeypatch, lambda b, outs: {"other": v for v in outs.values()})
    with pytest.raises(er.ArtifactError, match="'logits' is missing"):
        er.load(make_artifact("text-classification"), device="fake")


def test_the_check_runs_once_per_bucket(make_artifact):
    with er.load(make_artifact("text-classification", buckets=(8, 16)), device="fake") as rt:
        assert rt._outputs_checked == [True, True]       # both checked by the warm-up
        assert rt.infer("hi").prediction in ("negative", "positive")


def test_codes_of_the_other_signedness_for_a_quantized_output_are_refused(coral_artifact, monkeypatch):
    """Coral's uint8 output (zero point 0 here) fed back as int8 codes: dequantized with the uint8
    parameters, a code 200 would be read as -56."""
    from edge_runtime.devices import tflite_backend

    real = tflite_backend.TfliteSession._run

    def as_int8(self, feeds, cancel):
        return {k: v.view(np.int8) if v.dtype == np.uint8 else v for k, v in real(self, feeds, cancel).items()}

    monkeypatch.setattr(tflite_backend.TfliteSession, "_run", as_int8)
    with pytest.raises(er.ArtifactError) as ei:
        er.load(coral_artifact, device="tflite")
    assert ei.value.code == "output_contract_mismatch"
    assert "is int8, the manifest's is uint8" in str(ei.value)


def test_what_is_accepted():
    specs = [{"name": "q", "dtype": "uint8", "shape": [1, 4], "quantization": {"scale": 0.1, "zero_point": 3}},
             {"name": "f", "dtype": "float32", "shape": [2, 2]},
             {"name": "ids", "dtype": "int64", "shape": [4]}]
    ok = {"q": np.zeros((1, 4), np.float32),        # dequantized by the backend itself (OpenVINO on .tflite)
          "f": np.zeros((4,), np.float16),          # another float width, another (same-size) shape
          "ids": np.zeros(4, np.int32)}             # another integer type without quantization
    assert output_problems(ok, specs) == []
    assert len(output_problems({"q": np.zeros((1, 4), np.int8), "f": np.zeros(4, np.int32),
                                "ids": np.zeros(3, np.int64)}, specs)) == 3


def test_a_boolean_among_numbers_is_refused_not_read_as_one(make_artifact):
    """Before: a JSON [true, 2] reached the model as [1, 2]."""
    from edge_runtime.models.tensors import _as_array

    spec = {"name": "x", "dtype": "float32", "shape": [1, 2]}
    for value in ([True, 2], [[1.5, False]], [np.bool_(True), 2.0], ([1, 2], [3, True])):
        with pytest.raises(er.InputError, match="mixes booleans") as ei:
            _as_array(value, "x", spec)
        assert ei.value.code == "input_wrong_type"
    assert _as_array([[1, 2]], "x", spec).tolist() == [[1.0, 2.0]]
    assert _as_array([True, 1], "b", {"name": "b", "dtype": "bool", "shape": [2]}).tolist() == [True, True]
    assert _as_array([True, False], "x", spec).tolist() == [1.0, 0.0]      # all booleans: cast as before
