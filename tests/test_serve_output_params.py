"""Per-tensor parameters of a served request that change what the answer holds, with the real
``tritonclient`` (HTTP and gRPC) against a real ``edge-infer serve`` on the digits artifact:

- ``class_count`` (Triton's classification extension, ``parameters.classification``) answers the
  output as BYTES ``[N, k]`` ``"<score>:<index>:<label>"``, the in-process result's top classes;
  before, the parameter was dropped and the plain FP32 ``score`` came back;
- shared-memory parameters on an input or a requested output are a 400 / INVALID_ARGUMENT
  ``serve_extension_unsupported``; before, an output's region was silently left unwritten while
  the client read it as the answer (200);
- a classification the model cannot answer (more classes than it ranks, on ``result``, on a model
  that is not a classifier) and an unknown output parameter are refused before any model work.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

th = pytest.importorskip("tritonclient.http")
tg = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("grpc")
pytest.importorskip("starlette")

from grpc_harness import ServeProcess  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

import edge_runtime as er  # noqa: E402
from edge_runtime import error_codes as ec  # noqa: E402
from edge_runtime.serve_outputs import Sizes, outputs_of_kind  # noqa: E402
from edge_runtime.serve_types import ServeError  # noqa: E402

HELD_OUT = Path(__file__).resolve().parents[1] / "models" / "zoo" / "digits-cnn" / "held_out"


def _images(n: int = 3) -> list[bytes]:
    return [p.read_bytes() for p in sorted(HELD_OUT.rglob("*.png"))[::41][:n]]


@pytest.fixture(scope="module")
def served(digits_artifact):
    proc = ServeProcess([digits_artifact])
    yield proc
    assert proc.close() == 0, proc.output()


@pytest.fixture(scope="module")
def name(digits_artifact):
    return json.loads((digits_artifact / "manifest.json").read_text())["model"]["name"]


@pytest.fixture(scope="module")
def expected(digits_artifact):
    rt = er.load(digits_artifact, device="onnxruntime")
    try:
        return [rt.infer(b).top_k for b in _images()], len(rt.task.labels), rt.task.top_k
    finally:
        rt.close()


@pytest.fixture(scope="module")
def http(served):
    c = th.InferenceServerClient(f"127.0.0.1:{served.http_port}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def grpc_client(served):
    c = tg.InferenceServerClient(served.target)
    yield c
    c.close()


def _input(mod, items: list[bytes], binary: bool = True):
    t = mod.InferInput("image", [len(items)], "BYTES")
    if mod is th:
        t.set_data_from_numpy(np.array(items, dtype=object), binary_data=binary)
    else:
        t.set_data_from_numpy(np.array(items, dtype=object))
    return t


def _parse(values) -> list[list[tuple[float, int, str]]]:
    rows = []
    for row in np.asarray(values):
        out = []
        for v in row:
            s = v.decode() if isinstance(v, bytes) else str(v)
            score, index, label = s.split(":", 2)
            out.append((float(score), int(index), label))
        rows.append(out)
    return rows


def _check(rows, expected_top, k):
    assert len(rows) == len(expected_top)
    for row, top in zip(rows, expected_top):
        assert len(row) == k
        for (score, index, label), t in zip(row, top[:k]):
            assert index == t["index"] and label == t["label"]
            assert score == pytest.approx(t["score"], abs=1e-6)


@pytest.mark.parametrize("binary", [True, False])
def test_http_class_count_answers_the_top_classes(http, name, expected, binary):
    tops, _, _ = expected
    out = th.InferRequestedOutput("score", binary_data=binary, class_count=3)
    res = http.infer(name, [_input(th, _images())], outputs=[out, th.InferRequestedOutput("class_id")])
    got = res.get_output("score")
    assert got["datatype"] == "BYTES" and got["shape"] == [3, 3]
    _check(_parse(res.as_numpy("score")), tops, 3)
    assert res.as_numpy("class_id").tolist() == [t[0]["index"] for t in tops]     # the others unchanged


def test_grpc_class_count_answers_the_top_classes(grpc_client, name, expected):
    tops, _, _ = expected
    out = tg.InferRequestedOutput("top_k_scores", class_count=2)
    res = grpc_client.infer(name, [_input(tg, _images())], outputs=[out])
    got = res.get_output("top_k_scores")
    assert got.datatype == "BYTES" and list(got.shape) == [3, 2]
    _check(_parse(res.as_numpy("top_k_scores")), tops, 2)


def test_server_metadata_lists_the_classification_extension(http, grpc_client):
    assert "classification" in http.get_server_metadata()["extensions"]
    assert "classification" in grpc_client.get_server_metadata(as_json=True)["extensions"]


def _http_error(http, name, **kw) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        http.infer(name, [kw.pop("inp", None) or _input(th, _images(1))], **kw)
    return info.value


def _grpc_error(grpc_client, name, **kw) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer(name, [kw.pop("inp", None) or _input(tg, _images(1))], **kw)
    return info.value


def test_shared_memory_output_is_refused_not_left_unwritten(http, grpc_client, name):
    out = th.InferRequestedOutput("score", binary_data=True)
    out.set_shared_memory("region0", 64)
    err = _http_error(http, name, outputs=[out])
    assert int(err.status()) == 400 and "shared_memory_region" in str(err)
    gout = tg.InferRequestedOutput("score")
    gout.set_shared_memory("region0", 64)
    gerr = _grpc_error(grpc_client, name, outputs=[gout])
    assert gerr.status() == "StatusCode.INVALID_ARGUMENT" and "shared_memory_region" in gerr.message()
    # the server goes on serving
    res = http.infer(name, [_input(th, _images(1))])
    assert res.as_numpy("class_id").shape == (1,)


def test_shared_memory_input_is_refused_by_name(http, grpc_client, name):
    inp = th.InferInput("image", [1], "BYTES")
    inp.set_shared_memory("region0", 128)
    err = _http_error(http, name, inp=inp)
    assert int(err.status()) == 400 and "shared_memory_region" in str(err)
    ginp = tg.InferInput("image", [1], "BYTES")
    ginp.set_shared_memory("region0", 128)
    gerr = _grpc_error(grpc_client, name, inp=ginp)
    assert gerr.status() == "StatusCode.INVALID_ARGUMENT" and "shared_memory_region" in gerr.message()


def test_classification_the_model_cannot_answer_is_a_400(http, grpc_client, name, expected):
    _, classes, top_k = expected
    assert top_k and top_k < classes          # digits ranks its top 5 of 10 classes
    err = _http_error(http, name, outputs=[th.InferRequestedOutput("score", class_count=top_k + 1)])
    assert int(err.status()) == 400 and f"top {top_k} of {classes}" in str(err)
    err = _http_error(http, name, outputs=[th.InferRequestedOutput("result", class_count=2)])
    assert int(err.status()) == 400 and "not 'result'" in str(err)
    gerr = _grpc_error(grpc_client, name, outputs=[tg.InferRequestedOutput("score", class_count=top_k + 1)])
    assert gerr.status() == "StatusCode.INVALID_ARGUMENT" and f"top {top_k} of {classes}" in gerr.message()


def test_unknown_output_parameter_and_bad_count_are_refused(served, name):
    import http.client

    def post(doc: dict) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", served.http_port, timeout=30)
        try:
            conn.request("POST", f"/v2/models/{name}/infer", body=json.dumps(doc))
            r = conn.getresponse()
            return r.status, json.loads(r.read())
        finally:
            conn.close()

    img = _images(1)[0]
    base = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": [img.decode("latin-1")]}]}
    status, body = post({**base, "outputs": [{"name": "score", "parameters": {"top_n": 3}}]})
    assert status == 400 and body["code"] == ec.SERVE_EXTENSION_UNSUPPORTED and "top_n" in body["error"]
    shm = {"shared_memory_region": "r0", "shared_memory_byte_size": 64}
    status, body = post({**base, "outputs": [{"name": "score", "parameters": shm}]})
    assert status == 400 and body["code"] == ec.SERVE_EXTENSION_UNSUPPORTED
    for bad in (-1, 2.5, "3", True):
        status, body = post({**base, "outputs": [{"name": "score", "parameters": {"classification": bad}}]})
        assert status == 400 and body["code"] == ec.SERVE_REQUEST_MALFORMED, (bad, body)


def _results(tops: list[list[tuple[int, float]]]):
    return [SimpleNamespace(top_k=[{"index": i, "label": f"c{i}", "score": s} for i, s in top]) for top in tops]


def test_count_over_the_classes_is_cut_to_them_when_all_are_ranked():
    served = outputs_of_kind("classifier", Sizes(top_k=3, classes=3))
    rs = _results([[(2, 0.7), (0, 0.2), (1, 0.1)]])
    served.check_classification({"score": 5})
    (t,) = served.build(rs, ["score"], {"score": 5})
    assert t.datatype == "BYTES" and t.shape == [1, 3]
    assert t.data == [b"0.700000:2:c2", b"0.200000:0:c0", b"0.100000:1:c1"]
    (plain,) = served.build(rs, ["score"], {})
    assert plain.datatype == "FP32" and plain.data == [0.7]


@pytest.mark.parametrize("kind", ["embedding", "detection", "pose", "tensors"])
def test_classification_on_another_kind_of_model_is_refused(kind):
    served = outputs_of_kind(kind, Sizes())
    first = served.outputs[0].name
    with pytest.raises(ServeError) as info:
        served.check_classification({first: 1})
    assert info.value.status == "bad_request" and "classifier" in info.value.message


def test_an_outputs_own_binary_data_false_overrides_binary_data_output(served, name):
    """The protocol: ``binary_data_output`` is every output's default, an output's own ``binary_data``
    overrides it. Before, ``binary_data: false`` under ``binary_data_output: true`` still came binary."""
    import http.client

    img = _images(1)[0]
    blob = len(img).to_bytes(4, "little") + img
    doc = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1],
                       "parameters": {"binary_data_size": len(blob)}}],
           "parameters": {"binary_data_output": True},
           "outputs": [{"name": "class_id", "parameters": {"binary_data": False}}, {"name": "score"}]}
    head = json.dumps(doc).encode()
    conn = http.client.HTTPConnection("127.0.0.1", served.http_port, timeout=30)
    try:
        conn.request("POST", f"/v2/models/{name}/infer", body=head + blob,
                     headers={"Inference-Header-Content-Length": str(len(head))})
        r = conn.getresponse()
        body, head_len = r.read(), r.getheader("Inference-Header-Content-Length")
    finally:
        conn.close()
    assert r.status == 200 and head_len is not None
    outs = {o["name"]: o for o in json.loads(body[:int(head_len)])["outputs"]}
    assert "data" in outs["class_id"] and "binary_data_size" not in outs["class_id"].get("parameters", {})
    assert outs["score"]["parameters"]["binary_data_size"] == 4 and "data" not in outs["score"]
