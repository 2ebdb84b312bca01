"""``edge-infer serve``: which outputs a model answers with, their shapes and its metadata come from the
model's TASK, never from the values of one result (2026-12 bug hunt, /tmp/hunt_serve):

1. a detector answers ``num_detections`` + ``result`` by default, for an image with boxes as for one
   without (it answered ``label``/``class_id``/``score`` = NaN when the first image held a box);
2. a detector request mixing images with and without boxes is a 200 (was a 500, ``int(None)``), and
   which outputs exist does not depend on the order;
3. a segmentation request with images of different sizes is a 200 (was a 500 from ``np.stack``): the
   masks padded with 255 to the largest, ``mask_size`` giving each item's ``[H, W]``;
4. every output carries the items as its first axis for one item as for many (``mask`` ``[1, H, W]``,
   ``image_size`` ``[1, 2]``), and the metadata states what answers hold (``-1`` where a size varies);
5. a pose request naming no output gets ``keypoints`` FP32 ``[N, 17, 3]`` and ``image_size`` (``result`` by name);
7. a call option the task does not take (a typo, or any option to a task that takes none) is the
   runtime's 400 / INVALID_ARGUMENT, as in-process; the protocol's own parameters are not options;
8. a runtime 413 (``input_batch_too_large``) is in ``edge_serve_rejections_total{reason="too_large"}``.

The real models (YOLOv8n, MoveNet, DeepLabV3, Coral's split_concat, imported in about a second) run
in one in-process ``ServeCore`` per module, and once over the wire (one ``edge-infer serve`` process
per module, HTTP JSON and binary and gRPC through tritonclient, stopped at the end).
"""

from __future__ import annotations

import asyncio
import io
import json
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import need_litert, shared
from edge_runtime import error_codes as ec
from edge_runtime.serve_types import InferRequest, ServeError, Tensor

MASK_PAD = 255                  # serve_tensors.MASK_PAD, as README states it
DETECTOR, POSE, SEG, TENSORS = "yolov8n_full_integer_quant", "movenet_single_pose_lightning_ptq", \
    "deeplabv3_mnv2_pascal_quant", "split_concat"


def _png(w: int, h: int, color=(128, 128, 128)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    import re

    from edge_runtime.converters.tflite_import import import_tflite

    need_litert()
    root = tmp_path_factory.mktemp("vision-outputs")
    text = shared("detection", "yolov8n_tflite", "metadata.yaml").read_text()
    names = dict((int(k), v.strip()) for k, v in re.findall(r"^\s+(\d+):\s*(.+)$", text, flags=re.M))
    (root / "coco80.txt").write_text("\n".join(names[i] for i in range(80)) + "\n")
    import_tflite(shared("detection", "yolov8n_tflite", "yolov8n_full_integer_quant.tflite"), root / "det",
                  task="object-detection", labels=root / "coco80.txt", scale="1/255")
    import_tflite(shared("coral", "movenet_single_pose_lightning_ptq.tflite"), root / "pose", task="pose-estimation")
    import_tflite(shared("coral", "deeplabv3_mnv2_pascal_quant.tflite"), root / "seg", task="semantic-segmentation",
                  labels=shared("coral", "pascal_voc_segmentation_labels.txt"))
    import_tflite(shared("coral", "tools", "split_concat.tflite"), root / "tensors", task="tensors")
    return {k: root / k for k in ("det", "pose", "seg", "tensors")}


@pytest.fixture(scope="module")
def images():
    return {"bus": shared("detection", "images", "bus.jpg").read_bytes(), "blank": _png(320, 240),
            "squat": shared("coral", "squat.bmp").read_bytes(),            # 610 x 500 (w x h)
            "bird": shared("coral", "bird_segmentation.bmp").read_bytes()}  # 513 x 513


@pytest.fixture(scope="module")
def served(arts):
    """One in-process ``ServeCore`` of the four models, and the event loop its calls run in."""
    from edge_runtime.serve_core import ServeCore

    core = ServeCore(list(arts.values()), verify=False)
    loop = asyncio.new_event_loop()
    try:
        core.load_all()
        yield SimpleNamespace(core=core, loop=loop)
    finally:
        core.close()
        loop.close()


def _call(served, model: str, items: list, outputs=None, parameters=None):
    """The response or the ServeError of one image request to the in-process core."""
    req = InferRequest(model, None, [Tensor("image", "BYTES", [len(items)], list(items))], outputs=outputs,
                       parameters=dict(parameters or {}))
    try:
        return served.loop.run_until_complete(served.core.infer(req))
    except ServeError as err:
        return err


def _outs(resp) -> dict:
    assert not isinstance(resp, BaseException), resp
    return {t.name: t for t in resp.outputs}


def _rt(served, model: str):
    return next(m.rt for m in served.core.models.values() if m.name == model)


def _meta(served, model: str) -> dict:
    return {o["name"]: (o["datatype"], o["shape"]) for o in served.core.model_metadata(model, None)["outputs"]}


def _fits(shape: list[int], meta_shape: list[int]) -> bool:
    return len(shape) == len(meta_shape) and all(m in (-1, s) for m, s in zip(meta_shape, shape))


# -- 1, 2: a detector's outputs do not depend on what its images hold ---------------------------------
@pytest.mark.parametrize("order", [("bus",), ("blank",), ("bus", "blank"), ("blank", "bus")])
def test_a_detector_answers_num_detections_and_result_whatever_its_images_hold(served, images, order):
    items = [images[k] for k in order]
    want = [_rt(served, DETECTOR).infer(x) for x in items]
    assert [len(w.detections) > 0 for w in want] == [k == "bus" for k in order]      # the premise
    outs = _outs(_call(served, DETECTOR, items))
    assert list(outs) == ["num_detections", "result"]
    assert outs["num_detections"].shape == [len(items)]
    assert list(outs["num_detections"].data) == [len(w.detections) for w in want]
    docs = [json.loads(b) for b in outs["result"].data]
    assert [d["detections"] for d in docs] == [w.to_dict()["detections"] for w in want]
    # the classifier outputs are not a detector's, whichever image comes first (was: 200 or 400 by order)
    err = _call(served, DETECTOR, items, outputs=["label"])
    assert isinstance(err, ServeError) and err.status == "bad_request" and "'label'" in err.message, err
    assert list(_outs(_call(served, DETECTOR, items, outputs=["num_detections"]))) == ["num_detections"]


# -- 3, 4: segmentation masks: [N, H, W] always; images of different sizes padded ---------------------
def test_segmentation_masks_carry_the_batch_axis_and_images_of_different_sizes_are_a_200(served, images):
    rt = _rt(served, SEG)
    for order in (("bird",), ("squat",), ("bird", "bird"), ("squat", "bird"), ("bird", "squat")):
        items = [images[k] for k in order]
        want = [rt.infer(x).outputs["mask"] for x in items]
        outs = _outs(_call(served, SEG, items))
        assert list(outs) == ["mask", "mask_size"], order
        mask, size = np.asarray(outs["mask"].data), outs["mask_size"]
        h, w = max(m.shape[0] for m in want), max(m.shape[1] for m in want)
        assert outs["mask"].datatype == "UINT8" and list(mask.shape) == outs["mask"].shape == [len(items), h, w]
        assert size.datatype == "INT32" and size.shape == [len(items), 2]
        assert np.asarray(size.data).reshape(-1, 2).tolist() == [list(m.shape) for m in want]
        for i, m in enumerate(want):
            np.testing.assert_array_equal(mask[i, :m.shape[0], :m.shape[1]], m)
            assert (mask[i, m.shape[0]:] == MASK_PAD).all() and (mask[i, :, m.shape[1]:] == MASK_PAD).all()
    assert list(_outs(_call(served, SEG, [images["squat"], images["bird"]], outputs=["result"]))) == ["result"]


def test_padding_masks_past_the_pixel_limit_is_a_400_naming_why(served):
    from edge_runtime.serve_tensors import MASK_PAD as pad, served_outputs

    assert pad == MASK_PAD
    task = _rt(served, SEG).task
    outputs = served_outputs(task, SimpleNamespace(max_image_pixels=100))
    tall, wide = (SimpleNamespace(outputs={"mask": np.zeros(shape, np.uint8)}) for shape in ((50, 1), (1, 50)))
    with pytest.raises(ServeError) as e:
        outputs.build([tall, wide], ["mask"])
    assert e.value.status == "bad_request" and e.value.code == ec.INPUT_TOO_MANY_PIXELS
    assert "50x1" in e.value.message and "separate requests" in e.value.message
    assert [t.shape for t in outputs.build([tall, wide], ["mask_size"])] == [[2, 2]]     # the sizes still come


# -- 4, 5: pose ------------------------------------------------------------------------------------
def test_pose_answers_its_keypoints_by_default_and_image_size_is_n_by_2(served, images):
    rt = _rt(served, POSE)
    for order in (("squat",), ("squat", "bird")):
        items = [images[k] for k in order]
        want = [rt.infer(x) for x in items]
        outs = _outs(_call(served, POSE, items))
        assert list(outs) == ["keypoints", "image_size"]
        np.testing.assert_array_equal(np.asarray(outs["keypoints"].data), np.array(
            [[[p["x"], p["y"], p["score"]] for p in w.keypoints] for w in want], dtype=np.float32))
        (doc,) = _call(served, POSE, items, outputs=["result"]).outputs
        assert [json.loads(b)["keypoints"] for b in doc.data] == [w.to_dict()["keypoints"] for w in want]
        size = outs["image_size"]
        assert size.datatype == "INT32" and size.shape == [len(items), 2]
        assert np.asarray(size.data).tolist() == [w.outputs["image_size"].tolist() for w in want]


# -- 4: the metadata states what every answer holds -------------------------------------------------
def test_metadata_comes_from_the_task_and_every_answer_fits_it(served, images):
    assert _meta(served, DETECTOR) == {"num_detections": ("INT64", [-1]), "result": ("BYTES", [-1])}
    assert _meta(served, POSE) == {"keypoints": ("FP32", [-1, 17, 3]), "image_size": ("INT32", [-1, 2]),
                                   "result": ("BYTES", [-1])}
    assert _meta(served, SEG) == {"mask": ("UINT8", [-1, -1, -1]), "mask_size": ("INT32", [-1, 2]),
                                  "result": ("BYTES", [-1])}
    for model in (DETECTOR, POSE, SEG):
        meta = _meta(served, model)
        for order in (("bus",), ("blank", "squat"), ("bird", "bus", "blank")):
            for name in meta:
                (t,) = _call(served, model, [images[k] for k in order], outputs=[name]).outputs
                assert (t.datatype, t.shape[0]) == (meta[name][0], len(order)), (model, name, order)
                assert _fits(t.shape, meta[name][1]), (model, name, t.shape, meta[name])


def test_a_tensors_model_states_its_declared_outputs_with_a_batch_axis(served):
    model = next(m for m in served.core.models.values() if m.name == TENSORS)
    meta = served.core.model_metadata(TENSORS, None)
    specs = model.rt.variant.buckets[0]
    assert [i["shape"] for i in meta["inputs"]] == [[-1] + i["shape"][1:] for i in specs["inputs"]]
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == \
        [(o["name"], "FP32", [-1] + o["shape"][1:]) for o in specs["outputs"]] + [("result", "BYTES", [-1])]
    rng = np.random.default_rng(0)
    for n in (1, 3):
        arrays = {i["name"]: rng.integers(0, 256, [n] + i["shape"][1:]).astype(np.uint8) for i in specs["inputs"]}
        req = InferRequest(TENSORS, None, [Tensor(k, "UINT8", list(v.shape), v) for k, v in arrays.items()])
        outs = _outs(served.loop.run_until_complete(served.core.infer(req)))
        assert [k for k in outs] == [o["name"] for o in specs["outputs"]]
        want = [model.rt.infer({k: v[i:i + 1] for k, v in arrays.items()}) for i in range(n)]
        for o in specs["outputs"]:
            t = outs[o["name"]]
            assert t.datatype == "FP32" and t.shape == [n] + o["shape"][1:]
            np.testing.assert_array_equal(np.asarray(t.data), np.concatenate([w.outputs[o["name"]] for w in want]))


def test_a_task_of_its_own_answers_result_alone():
    from edge_runtime.serve_tensors import served_outputs, task_kind

    class Mine:
        name = "my-task"

    outputs = served_outputs(Mine())
    assert task_kind(Mine()) is None and outputs.metadata() == [{"name": "result", "datatype": "BYTES", "shape": [-1]}]


# -- 7: call options --------------------------------------------------------------------------------
@pytest.mark.parametrize("model, options", [(DETECTOR, {"score_treshold": 0.85}), (SEG, {"score_threshold": 0.5}),
                                            (POSE, {"max_detections": 1})])
def test_an_option_the_task_does_not_take_is_the_runtimes_400(served, images, model, options):
    from edge_runtime.errors import InputError

    with pytest.raises(InputError) as want:
        _rt(served, model).infer(images["bus"], options=options)
    for items in ([images["bus"]], [images["bus"], images["blank"]]):
        err = _call(served, model, items, parameters=options)
        assert isinstance(err, ServeError), err
        assert (err.status, err.code, err.message) == ("bad_request", want.value.code, want.value.message)


def test_the_protocols_parameters_are_not_options_and_a_real_option_applies(served, images):
    protocol = {"timeout": 10_000_000, "sequence_id": 0, "sequence_start": False, "sequence_end": False,
                "priority": 0, "binary_data_output": True, "triton_enable_empty_final_response": False,
                "content_type": "np"}
    assert list(_outs(_call(served, SEG, [images["bird"]], parameters=protocol))) == ["mask", "mask_size"]
    outs = _outs(_call(served, DETECTOR, [images["bus"]], parameters={**protocol, "max_detections": 1}))
    assert list(outs["num_detections"].data) == [1]


# -- 8: a runtime 413 is a rejection --------------------------------------------------------------------
def test_a_runtime_413_is_counted_as_a_too_large_rejection(served, images):
    limit = _rt(served, SEG).limits.max_batch_items
    err = _call(served, SEG, [images["blank"][:8]] * (limit + 1))
    assert isinstance(err, ServeError) and (err.status, err.code) == ("too_large", ec.INPUT_BATCH_TOO_LARGE), err
    text = served.core.metrics_text()
    assert 'edge_serve_rejections_total{reason="too_large"} 1' in text, text
    assert f'edge_serve_requests_total{{model="{SEG}",status="too_large"}} 1' in text


# -- over the wire: tritonclient HTTP (JSON and binary) and gRPC ---------------------------------------
@pytest.fixture(scope="module")
def server(arts):
    pytest.importorskip("tritonclient.http")
    pytest.importorskip("tritonclient.grpc")
    from serve_proc import ServerProc

    with ServerProc(arts["det"], arts["pose"], arts["seg"], grpc=True) as srv:
        yield srv


def _wire(server, proto: str, model: str, items: list, outputs=None, parameters=None):
    """(outputs {name: (datatype, shape, array)}, None) or (None, the error's text)."""
    import tritonclient.grpc as gc
    import tritonclient.http as hc
    from tritonclient.utils import InferenceServerException

    mod = gc if proto == "grpc" else hc
    client = mod.InferenceServerClient(server.grpc if proto == "grpc" else server.http)
    kw = {} if proto == "grpc" else {"binary_data": proto == "http-binary"}
    try:
        inp = mod.InferInput("image", [len(items)], "BYTES")
        inp.set_data_from_numpy(np.array(items, dtype=object), **({} if proto == "grpc" else {"binary_data": True}))
        outs = None if outputs is None else [mod.InferRequestedOutput(n, **kw) for n in outputs]
        res = client.infer(model, [inp], outputs=outs, parameters=parameters)
        doc = res.get_response(as_json=True) if proto == "grpc" else res.get_response()
        return {o["name"]: (o["datatype"], [int(d) for d in o["shape"]], res.as_numpy(o["name"]))
                for o in doc["outputs"]}, None
    except InferenceServerException as exc:
        return None, f"{exc.status()} {exc.message()}"
    finally:
        client.close()


@pytest.mark.parametrize("proto", ["http-json", "http-binary", "grpc"])
def test_over_the_wire_the_outputs_follow_the_task_and_the_metadata(server, served, images, proto):
    import tritonclient.http as hc

    h = hc.InferenceServerClient(server.http)
    try:
        metas = {m: {o["name"]: (o["datatype"], o["shape"]) for o in h.get_model_metadata(m)["outputs"]}
                 for m in (DETECTOR, POSE, SEG)}
    finally:
        h.close()
    assert metas == {m: _meta(served, m) for m in metas}
    defaults = {DETECTOR: ["num_detections", "result"], POSE: ["keypoints", "image_size"], SEG: ["mask", "mask_size"]}
    for model, orders in ((DETECTOR, (("bus",), ("bus", "blank"), ("blank", "bus"))),
                          (POSE, (("squat",), ("squat", "bird"))), (SEG, (("bird",), ("squat", "bird")))):
        rt = _rt(served, model)
        for order in orders:
            items = [images[k] for k in order]
            want = [rt.infer(x) for x in items]
            got, err = _wire(server, proto, model, items)
            assert err is None, (model, order, err)
            assert list(got) == defaults[model], (model, order)
            for name, (datatype, shape, arr) in got.items():
                assert datatype == metas[model][name][0] and shape[0] == len(items), (model, name, shape)
                assert _fits(shape, metas[model][name][1]) and list(arr.shape) == shape, (model, name, shape)
            if model == DETECTOR:
                assert got["num_detections"][2].tolist() == [len(w.detections) for w in want]
            if model == SEG:
                for i, w in enumerate(want):
                    m = w.outputs["mask"]
                    np.testing.assert_array_equal(got["mask"][2][i, :m.shape[0], :m.shape[1]], m)
            if model == POSE:
                np.testing.assert_array_equal(got["keypoints"][2], np.array(
                    [[[p["x"], p["y"], p["score"]] for p in w.keypoints] for w in want], dtype=np.float32))
    got, err = _wire(server, proto, DETECTOR, [images["bus"]], parameters={"score_treshold": 0.85})
    assert got is None and ("400" in err or "INVALID_ARGUMENT" in err) and "score_treshold" in err, err
    got, err = _wire(server, proto, SEG, [images["bird"]], parameters={"score_threshold": 0.5})
    assert got is None and ("400" in err or "INVALID_ARGUMENT" in err) and "no per-call options" in err, err
