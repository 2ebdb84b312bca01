"""``edge-infer serve`` of a pose model (MoveNet SinglePose Lightning, Coral's PTQ TFLite): by default
it answers a typed ``keypoints`` FP32 ``[N, K, 3]`` (K = 17, COCO's order; per keypoint x, y in the
original image's pixels and score, exactly the in-process result's ``keypoints``) and ``image_size``
INT32 ``[N, 2]``, and its metadata says so, over HTTP JSON, HTTP binary and gRPC, for one image as
for several. ``result`` (the keypoints' names, the pose score) comes when named.

Before 2026-12-06 a pose model had no typed keypoints: its default answer was ``result`` (JSON text
per item) and ``image_size``, its metadata listed those two, and asking for ``keypoints`` was a 400.

The in-process core and the wire helpers are ``test_serve_vision_outputs``'s, on the pose model alone.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from test_pose_segmentation import movenet_artifact  # noqa: F401  (the session fixture)
from test_serve_vision_outputs import POSE, _call, _meta, _outs, _rt, _wire, images, served  # noqa: F401

K = 17
ORDERS = (("squat",), ("squat", "bird"), ("bus", "squat", "blank"))


@pytest.fixture(scope="module")
def arts(movenet_artifact):  # noqa: F811
    """The models ``served`` (test_serve_vision_outputs's in-process core) serves: the pose model alone."""
    return {"pose": movenet_artifact}


def _want(rt, items: list) -> tuple[np.ndarray, list]:
    """The in-process results' keypoints as ``[N, K, 3]`` float32 (x, y, score), and the results."""
    res = [rt.infer(x) for x in items]
    return np.array([[[p["x"], p["y"], p["score"]] for p in r.keypoints] for r in res], dtype=np.float32), res


def test_pose_metadata_states_keypoints_n_by_17_by_3(served):
    assert _meta(served, POSE) == {"keypoints": ("FP32", [-1, K, 3]), "image_size": ("INT32", [-1, 2]),
                                   "result": ("BYTES", [-1])}


@pytest.mark.parametrize("order", ORDERS)
def test_pose_answers_typed_keypoints_by_default(served, images, order):
    items = [images[k] for k in order]
    want, res = _want(_rt(served, POSE), items)
    assert [p["name"] for p in res[0].keypoints][:3] == ["nose", "left_eye", "right_eye"]     # COCO's order
    outs = _outs(_call(served, POSE, items))
    assert list(outs) == ["keypoints", "image_size"]
    kp = outs["keypoints"]
    assert kp.datatype == "FP32" and kp.shape == [len(items), K, 3]
    np.testing.assert_array_equal(np.asarray(kp.data), want)
    assert np.asarray(outs["image_size"].data).tolist() == [r.outputs["image_size"].tolist() for r in res]
    (doc,) = _call(served, POSE, items, outputs=["result"]).outputs          # the names and the pose score
    assert [json.loads(b)["keypoints"] for b in doc.data] == [r.to_dict()["keypoints"] for r in res]


def test_keypoints_without_a_model_follow_the_results():
    """``response_outputs`` given no model's outputs (the results' fields say): keypoints too."""
    from types import SimpleNamespace

    from edge_runtime.serve_tensors import response_outputs

    r = SimpleNamespace(keypoints=[{"name": "a", "x": 1.5, "y": 2.0, "score": 0.25}] * 2,
                        outputs={"image_size": np.array([4, 5], np.int32)}, detections=None)
    kp, size = response_outputs([r, r], None)
    assert (kp.name, kp.datatype, kp.shape, size.shape) == ("keypoints", "FP32", [2, 2, 3], [2, 2])
    assert np.asarray(kp.data).tolist() == [[[1.5, 2.0, 0.25]] * 2] * 2


@pytest.fixture(scope="module")
def server(movenet_artifact):  # noqa: F811
    pytest.importorskip("tritonclient.http")
    pytest.importorskip("tritonclient.grpc")
    from serve_proc import ServerProc

    with ServerProc(movenet_artifact, grpc=True) as srv:
        yield srv


@pytest.mark.parametrize("proto", ["http-json", "http-binary", "grpc"])
def test_over_the_wire_pose_answers_keypoints_and_its_metadata_says_so(server, served, images, proto):
    import tritonclient.grpc as gc
    import tritonclient.http as hc

    for mod, target in ((hc, server.http), (gc, server.grpc)):
        c = mod.InferenceServerClient(target)
        try:
            md = c.get_model_metadata(POSE, as_json=True) if mod is gc else c.get_model_metadata(POSE)
        finally:
            c.close()
        assert {o["name"]: (o["datatype"], [int(d) for d in o["shape"]]) for o in md["outputs"]} == \
            _meta(served, POSE), (mod.__name__, md)
    rt = _rt(served, POSE)
    for order in ORDERS:
        items = [images[k] for k in order]
        want, res = _want(rt, items)
        got, err = _wire(server, proto, POSE, items)
        assert err is None, (order, err)
        assert list(got) == ["keypoints", "image_size"], order
        datatype, shape, arr = got["keypoints"]
        assert (datatype, shape, list(arr.shape), arr.dtype) == ("FP32", [len(items), K, 3], shape, np.float32)
        np.testing.assert_array_equal(arr, want)
        assert got["image_size"][2].tolist() == [r.outputs["image_size"].tolist() for r in res]
    got, err = _wire(server, proto, POSE, [images["squat"]], outputs=["keypoints"])
    assert err is None and list(got) == ["keypoints"], err
