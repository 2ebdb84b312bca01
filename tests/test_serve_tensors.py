"""Response tensors built as flat Python lists (a classifier's few scalars, no numpy array per
output) go on the wire byte for byte as the numpy arrays of their datatype would."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from edge_runtime.serve_tensors import response_outputs
from edge_runtime.serve_types import DATATYPES, InferResponse, Tensor, list_values, numeric_bytes
from edge_runtime.serve_wire import encode_response

VALUES = {"BOOL": [True, False, True], "UINT8": [0, 7, 255], "UINT16": [0, 65535, 3], "UINT32": [0, 2 ** 32 - 1, 5],
          "UINT64": [0, 2 ** 64 - 1, 9], "INT8": [-128, 0, 127], "INT16": [-32768, 1, 32767],
          "INT32": [-2 ** 31, 0, 2 ** 31 - 1], "INT64": [-2 ** 63, 3, 2 ** 63 - 1],
          "FP16": [0.1, -2.5, float("inf")], "FP32": [0.1, -1e-30, float("nan")], "FP64": [0.1, -1e300, 3.0]}


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_a_list_packs_as_the_numpy_array_of_its_datatype(datatype):
    values = VALUES[datatype]
    arr = np.array(values, dtype=DATATYPES[datatype])
    want = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
    assert numeric_bytes(datatype, values) == want
    assert numeric_bytes(datatype, arr) == want
    got = np.array(list_values(datatype, values), dtype=DATATYPES[datatype])
    np.testing.assert_array_equal(got, arr)                     # the JSON form holds the datatype's values
    if datatype == "FP32":
        assert list_values(datatype, values)[0] == float(np.float32(0.1)) != 0.1


def _result(class_id: int, scores: list[float]):
    top = [{"index": (class_id + i) % 10, "label": str((class_id + i) % 10), "score": s} for i, s in enumerate(scores)]
    d = {"prediction": str(class_id), "class_id": class_id, "top_k": top, "trace_id": f"t{class_id}"}
    return SimpleNamespace(prediction=str(class_id), class_id=class_id, top_k=top, embedding=None, detections=None,
                           outputs=None, to_dict=lambda: dict(d))


def _numpy_outputs(results) -> list[Tensor]:
    """What the server built before: one numpy array per numeric output."""
    n, k = len(results), len(results[0].top_k)
    return [Tensor("label", "BYTES", [n], [r.prediction.encode() for r in results]),
            Tensor("class_id", "INT64", [n], np.array([r.class_id for r in results], dtype=np.int64)),
            Tensor("score", "FP32", [n], np.array([r.top_k[0]["score"] for r in results], dtype=np.float32)),
            Tensor("top_k_class_ids", "INT64", [n, k],
                   np.array([[t["index"] for t in r.top_k] for r in results], dtype=np.int64)),
            Tensor("top_k_scores", "FP32", [n, k],
                   np.array([[t["score"] for t in r.top_k] for r in results], dtype=np.float32))]


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("binary", [True, False])
def test_classifier_outputs_encode_as_the_numpy_ones_did(n, binary):
    # float32 scores as the runtime returns them, and one float64 value that must round as before
    results = [_result(i, [float(np.float32(0.7 - i / 10)), float(np.float32(0.2)), 0.1]) for i in range(n)]
    got = response_outputs(results, None)
    assert [t.name for t in got] == ["label", "class_id", "score", "top_k_class_ids", "top_k_scores"]
    assert all(type(t.data) is list for t in got)
    want = _numpy_outputs(results)
    assert [(t.datatype, t.shape) for t in got] == [(t.datatype, t.shape) for t in want]
    a = encode_response(InferResponse("m", "1", got), binary, {})
    b = encode_response(InferResponse("m", "1", want), binary, {})
    assert a == b
    if not binary:
        doc = json.loads(a[0])
        assert doc["outputs"][4]["data"][2] == float(np.float32(0.1))


def test_grpc_raw_contents_are_the_same_bytes():
    pytest.importorskip("grpc")
    from edge_runtime.serve_grpc import to_message

    results = [_result(i, [0.5, 0.25]) for i in range(2)]
    got = to_message(InferResponse("m", "1", response_outputs(results, None)))
    want = to_message(InferResponse("m", "1", _numpy_outputs(results)))
    assert list(got.raw_output_contents) == list(want.raw_output_contents)
    assert [list(o.shape) for o in got.outputs] == [[2], [2], [2], [2, 2], [2, 2]]
