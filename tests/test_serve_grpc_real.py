"""The real ``edge-infer serve --grpc-port`` process on the digits and MiniLM classifier
artifacts, driven by the real ``tritonclient.grpc``: every RPC, the same answers as
in-process ``rt.infer``, ``async_infer``, the error mappings with the real core
(NOT_FOUND, INVALID_ARGUMENT, DEADLINE_EXCEEDED), and RESOURCE_EXHAUSTED / UNAVAILABLE
from a real ServeCore with one slot and no queue, then drained. About 10 s after the
session fixtures (the MiniLM build is the bulk).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("grpc")
tg = pytest.importorskip("tritonclient.grpc")

from grpc_harness import LoopServer, ServeProcess  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

DIGITS = Path(__file__).resolve().parents[1] / "models" / "zoo" / "digits-cnn" / "held_out"
TEXTS = ["a gorgeous, witty, seductive movie.", "the plot is a dull, lifeless mess.", "it is a film."]


def _digit_images() -> list[tuple[int, bytes]]:
    return [(d, next(iter(sorted((DIGITS / str(d)).glob("*.png")))).read_bytes()) for d in range(10)]


def _bytes_input(name: str, items: list[bytes]):
    t = tg.InferInput(name, [len(items)], "BYTES")
    t.set_data_from_numpy(np.array(items, dtype=object))
    return t


def _result_json(res) -> list[dict]:
    return [json.loads(x) for x in res.as_numpy("result")]


@pytest.fixture(scope="module")
def served(digits_artifact, minilm_classifier_artifact):
    """A real ``edge-infer serve`` process on 127.0.0.1 (free ports)."""
    proc = ServeProcess([digits_artifact, minilm_classifier_artifact])
    yield proc.target
    assert proc.close() == 0, proc.output()      # SIGTERM: drained and exited 0


@pytest.fixture(scope="module")
def names(digits_artifact, minilm_classifier_artifact):
    return {k: json.loads((p / "manifest.json").read_text())["model"]["name"] for k, p in
            (("image", digits_artifact), ("text", minilm_classifier_artifact))}


@pytest.fixture(scope="module")
def real(served):
    c = tg.InferenceServerClient(served)
    yield c
    c.close()


def test_real_health_and_metadata(real, names):
    assert real.is_server_live() and real.is_server_ready()
    md = real.get_server_metadata(as_json=True)
    assert md["name"] == "edge-runtime" and "binary_tensor_data" in md["extensions"]
    for kind, name in names.items():
        assert real.is_model_ready(name)
        mm = real.get_model_metadata(name, as_json=True)
        assert mm["name"] == name and mm["versions"]
        assert real.is_model_ready(name, mm["versions"][0])
        assert mm["inputs"] == [{"name": kind, "datatype": "BYTES", "shape": ["-1"]}]
        outs = {o["name"]: o["datatype"] for o in mm["outputs"]}
        assert outs["label"] == "BYTES" and outs["class_id"] == "INT64" and outs["score"] == "FP32"


def test_real_image_classification(real, names, digits_artifact):
    import edge_runtime as er

    images = _digit_images()
    res = real.infer(names["image"], [_bytes_input("image", [b for _, b in images])])
    labels = [x.decode() for x in res.as_numpy("label")]
    with er.load(digits_artifact) as rt:                         # the same answers as in-process
        want = [rt.infer(b) for _, b in images]
    assert labels == [str(r.prediction) for r in want]
    assert res.as_numpy("class_id").tolist() == [r.class_id for r in want]
    np.testing.assert_allclose(res.as_numpy("score"), [r.top_k[0]["score"] for r in want], atol=1e-6)
    assert sum(str(d) == lab for (d, _), lab in zip(images, labels)) >= 9
    assert res.as_numpy("top_k_scores").shape[0] == 10
    res = real.infer(names["image"], [_bytes_input("image", [b for _, b in images])],     # the JSON result, by name
                     outputs=[tg.InferRequestedOutput("result")])
    assert [j["prediction"] for j in _result_json(res)] == labels and res.as_numpy("label") is None
    # one decoded image as a UINT8 [H, W] array, and only the asked-for output
    from PIL import Image
    import io

    arr = np.asarray(Image.open(io.BytesIO(images[3][1])).convert("L"))
    t = tg.InferInput("image", list(arr.shape), "UINT8")
    t.set_data_from_numpy(arr)
    res = real.infer(names["image"], [t], outputs=[tg.InferRequestedOutput("label")])
    assert [x.decode() for x in res.as_numpy("label")] == [labels[3]]
    assert res.as_numpy("class_id") is None


def test_real_text_classification_and_async(real, names, minilm_classifier_artifact):
    import edge_runtime as er

    res = real.infer(names["text"], [_bytes_input("text", [t.encode() for t in TEXTS])], request_id="t-1")
    assert res.get_response().id == "t-1"
    with er.load(minilm_classifier_artifact) as rt:
        want = [rt.infer(t) for t in TEXTS]
    assert [x.decode() for x in res.as_numpy("label")] == [str(r.prediction) for r in want]
    np.testing.assert_allclose(res.as_numpy("score"), [r.top_k[0]["score"] for r in want], atol=1e-5)
    params = res.get_response(as_json=True)["parameters"]
    assert "trace_id" in params and "device" in params
    done: list = []
    for t in TEXTS:
        real.async_infer(names["text"], [_bytes_input("text", [t.encode()])],
                         callback=lambda result, error: done.append((result, error)))
    import time

    end = time.monotonic() + 30
    while len(done) < len(TEXTS) and time.monotonic() < end:
        time.sleep(0.01)
    assert all(e is None for _, e in done) and len(done) == len(TEXTS)
    assert sorted(r.as_numpy("label")[0].decode() for r, _ in done) == sorted(str(r.prediction) for r in want)


def _status(call) -> str:
    with pytest.raises(InferenceServerException) as ei:
        call()
    return ei.value.status()


def test_real_error_mappings(real, names):
    img, txt = names["image"], names["text"]
    good = _bytes_input("image", [_digit_images()[0][1]])
    assert _status(lambda: real.infer("no-such-model", [good])) == "StatusCode.NOT_FOUND"
    assert _status(lambda: real.is_model_ready(img, "999")) == "StatusCode.NOT_FOUND"
    assert _status(lambda: real.get_model_metadata("no-such-model")) == "StatusCode.NOT_FOUND"
    # bad inputs: undecodable image, an empty text, a text over the limit, a numeric tensor for text
    assert _status(lambda: real.infer(img, [_bytes_input("image", [b"not an image"])])) == "StatusCode.INVALID_ARGUMENT"
    assert _status(lambda: real.infer(txt, [_bytes_input("text", [b""])])) == "StatusCode.INVALID_ARGUMENT"
    assert _status(lambda: real.infer(txt, [_bytes_input("text", [b"x " * 20_000])])) == "StatusCode.INVALID_ARGUMENT"
    f = tg.InferInput("text", [1], "FP32")
    f.set_data_from_numpy(np.zeros(1, np.float32))
    assert _status(lambda: real.infer(txt, [f])) == "StatusCode.INVALID_ARGUMENT"
    assert _status(lambda: real.infer(img, [good], outputs=[tg.InferRequestedOutput("nope")])) \
        == "StatusCode.INVALID_ARGUMENT"
    # the request's timeout parameter (µs): 1 µs has passed before the model runs
    assert _status(lambda: real.infer(txt, [_bytes_input("text", [b"fine"])], timeout=1)) \
        == "StatusCode.DEADLINE_EXCEEDED"
    # still serving
    assert real.infer(img, [good]).as_numpy("label").shape == (1,)


def test_real_overload_and_not_ready(digits_artifact):
    """A real ServeCore with one slot and no queue: concurrent requests beyond it are
    RESOURCE_EXHAUSTED, never queued; after drain, UNAVAILABLE and not ready."""
    from edge_runtime.serve_core import ServeCore

    srv = LoopServer(ServeCore([digits_artifact], max_in_flight=1, max_queue=0))
    try:
        c = tg.InferenceServerClient(srv.target)
        name = json.loads((digits_artifact / "manifest.json").read_text())["model"]["name"]
        items = [b for _, b in _digit_images()] * 20                   # 200 images a request: a few ms each
        done: list = []
        for _ in range(24):
            c.async_infer(name, [_bytes_input("image", items)], callback=lambda result, error: done.append(error))
        import time

        end = time.monotonic() + 60
        while len(done) < 24 and time.monotonic() < end:
            time.sleep(0.01)
        statuses = [e.status() if e is not None else "OK" for e in done]
        assert len(statuses) == 24 and "OK" in statuses, [str(e) for e in done if e is not None][:3]
        assert "StatusCode.RESOURCE_EXHAUSTED" in statuses, statuses
        assert set(statuses) <= {"OK", "StatusCode.RESOURCE_EXHAUSTED"}
        assert srv.core._rejections["overloaded"] == statuses.count("StatusCode.RESOURCE_EXHAUSTED")
        srv.call(srv.core.drain(5))
        assert not c.is_server_ready() and c.is_server_live()
        assert _status(lambda: c.infer(name, [_bytes_input("image", items[:1])])) == "StatusCode.UNAVAILABLE"
        c.close()
    finally:
        srv.close()
        srv.core.close()


def test_real_token(digits_artifact):
    """``edge-infer serve --token``: the gRPC service asks for it too (probes excepted)."""
    proc = ServeProcess([digits_artifact], "--token", "grpc-test-token")
    try:
        c = tg.InferenceServerClient(proc.target)
        name = json.loads((digits_artifact / "manifest.json").read_text())["model"]["name"]
        good = _bytes_input("image", [_digit_images()[0][1]])
        assert c.is_server_live() and c.is_server_ready()
        assert _status(lambda: c.infer(name, [good])) == "StatusCode.UNAUTHENTICATED"
        assert _status(lambda: c.infer(name, [good], headers={"authorization": "Bearer nope"})) \
            == "StatusCode.UNAUTHENTICATED"
        res = c.infer(name, [good], headers={"authorization": "Bearer grpc-test-token"})
        assert res.as_numpy("label").shape == (1,)
        c.close()
    finally:
        assert proc.close() == 0, proc.output()
