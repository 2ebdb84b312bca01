"""``edge-infer serve`` over HTTP with the real ``tritonclient.http``: every endpoint, JSON and binary
tensors, text (MiniLM) and image (digits) models, async_infer, every error mapping, the token.

Real server processes on 127.0.0.1 with free ports, one per module scope; the mappings that need a
runtime to misbehave (500, 503 while loading/draining, 504, 429) are also checked on ``ServeCore``
in-process, where they are deterministic.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from serve_proc import ServerProc

th = pytest.importorskip("tritonclient.http")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
from tritonclient.utils import InferenceServerException  # noqa: E402

from edge_runtime import error_codes as ec  # noqa: E402
from edge_runtime.serve_types import HTTP_STATUS, InferRequest, ServeError, Tensor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = ROOT / "models" / "zoo" / "digits-cnn" / "held_out"
TEXTS = ["a charming and often affecting journey", "unflinchingly bleak and desperate",
         "the best film of the year", "a dull, lifeless mess"]


def digit_images(n=6):
    files = sorted(HELD_OUT.rglob("*.png"))[::17][:n]
    return [f.read_bytes() for f in files], [f.parent.name for f in files]


def bytes_input(name, values, binary=True):
    inp = th.InferInput(name, [len(values)], "BYTES")
    inp.set_data_from_numpy(np.array(values, dtype=object), binary_data=binary)
    return inp


def status_of(exc: InferenceServerException) -> int:
    return int(exc.status()) if exc.status() is not None else -1


@pytest.fixture(scope="module")
def digits_server(digits_artifact):
    with ServerProc(digits_artifact) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(digits_server):
    c = th.InferenceServerClient(digits_server.http, concurrency=4)
    yield c
    c.close()


@pytest.fixture(scope="module")
def text_server(minilm_classifier_artifact, minilm_embedding_artifact):
    with ServerProc(minilm_classifier_artifact, minilm_embedding_artifact) as srv:
        yield srv


# -- endpoints ---------------------------------------------------------------------------------
def test_health_and_metadata(client, digits_server):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "edge-runtime" and "binary_tensor_data" in meta["extensions"]
    m = client.get_model_metadata("digits-cnn")
    assert m["name"] == "digits-cnn" and m["versions"] == ["1"] and m["platform"].startswith("edge-runtime_")
    assert m["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
    assert {o["name"] for o in m["outputs"]} >= {"label", "class_id", "score", "top_k_scores", "result"}
    assert client.get_model_metadata("digits-cnn", "1") == m
    assert client.is_model_ready("digits-cnn") and client.is_model_ready("digits-cnn", "1")
    assert not client.is_model_ready("nope") and not client.is_model_ready("digits-cnn", "7")
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("nope")
    assert status_of(e.value) == 404 and "no model 'nope'" in str(e.value)


def test_curl_like_requests_need_no_content_type(digits_server):
    import http.client
    import json

    host, port = digits_server.http.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    for path, want in (("/v2/health/live", 200), ("/v2/health/ready", 200), ("/v2/models/digits-cnn/ready", 200),
                       ("/v2/models/nope/ready", 404), ("/v2/models/digits-cnn/versions/1/ready", 200)):
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        assert r.status == want, path
    pixels = np.zeros((8, 8), dtype=np.uint8)
    pixels[1:7, 3:5] = 255
    body = json.dumps({"id": "r1", "inputs": [{"name": "image", "datatype": "UINT8", "shape": [8, 8],
                                                "data": pixels.tolist()}], "outputs": [{"name": "class_id"}]})
    conn.request("POST", "/v2/models/digits-cnn/versions/1/infer", body=body)
    r = conn.getresponse()
    doc = json.loads(r.read())
    assert r.status == 200 and doc["id"] == "r1" and doc["model_version"] == "1"
    assert [o["name"] for o in doc["outputs"]] == ["class_id"] and doc["outputs"][0]["shape"] == [1]
    assert doc["parameters"]["device"] and doc["parameters"]["trace_id"]
    # the infer path's own handler (serve_http_infer) and Starlette's routes answer alike
    for method, path, want in (("GET", "/v2/models/digits-cnn/infer", 405), ("PUT", "/v2/models/x/versions/1/infer", 405),
                               ("GET", "/v2/nowhere", 404), ("POST", "/v2/models/digits-cnn/infer/more", 404)):
        conn.request(method, path)
        r = conn.getresponse()
        doc = json.loads(r.read())
        assert r.status == want and doc["code"] == "serve_request_malformed", (method, path, r.status, doc)
        assert doc["error"].startswith(f"no {method} {path} here") and r.getheader("content-type") == "application/json"
        assert want != 405 or r.getheader("allow") == "POST"
    conn.close()


def test_image_binary_matches_in_process(client, digits_artifact):
    import edge_runtime as er

    images, labels = digit_images()
    res = client.infer("digits-cnn", [bytes_input("image", images)])      # no output named: every typed one
    assert res.as_numpy("result") is None and res.as_numpy("top_k_class_ids").shape == (len(images), 5)
    res = client.infer("digits-cnn", [bytes_input("image", images)], outputs=[
        th.InferRequestedOutput(n) for n in ("label", "class_id", "score", "top_k_scores", "result")])
    assert list(res.as_numpy("label").astype(str)) == labels
    with er.load(digits_artifact) as rt:
        want = [rt.infer(x) for x in images]
    assert list(res.as_numpy("class_id")) == [r.class_id for r in want]
    np.testing.assert_allclose(res.as_numpy("score"), [r.top_k[0]["score"] for r in want], rtol=1e-5, atol=1e-6)
    assert res.as_numpy("top_k_scores").shape == (len(images), 5)
    import json
    results = [json.loads(x) for x in res.as_numpy("result")]
    assert [r["prediction"] for r in results] == labels and all(r["trace_id"] for r in results)
    params = res.get_response()["parameters"]
    assert params["model_version"] == "1" and len(params["trace_id"].split(",")) == len(images)


def test_image_uint8_tensor_json_and_binary(client):
    import io

    from PIL import Image

    images, labels = digit_images(3)
    arrays = np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("L")) for b in images])[..., None]   # N,H,W,1
    for binary in (False, True):
        inp = th.InferInput("image", list(arrays.shape), "UINT8")
        inp.set_data_from_numpy(arrays, binary_data=binary)
        out = [th.InferRequestedOutput("label", binary_data=binary), th.InferRequestedOutput("class_id",
                                                                                            binary_data=binary)]
        res = client.infer("digits-cnn", [inp], outputs=out)
        assert [x.decode() if isinstance(x, bytes) else x for x in res.as_numpy("label")] == labels
        assert res.as_numpy("class_id").dtype == np.int64


def test_async_infer(client):
    images, labels = digit_images(4)
    pending = [client.async_infer("digits-cnn", [bytes_input("image", [img])]) for img in images]
    got = [p.get_result(timeout=60).as_numpy("label")[0].decode() for p in pending]
    assert got == labels


def test_text_classification_and_embedding_json_and_binary(text_server, minilm_classifier_artifact,
                                                           minilm_embedding_artifact):
    import edge_runtime as er

    c = th.InferenceServerClient(text_server.http)
    try:
        with er.load(minilm_classifier_artifact) as rt:
            clf = rt.artifact.name
            want = [rt.infer(t) for t in TEXTS]
        with er.load(minilm_embedding_artifact) as rt:
            emb = rt.artifact.name
            want_emb = np.stack([rt.infer(t).embedding for t in TEXTS])
        for binary in (True, False):
            res = c.infer(clf, [bytes_input("text", TEXTS, binary)],
                          outputs=[th.InferRequestedOutput(n, binary_data=binary) for n in ("label", "class_id")])
            assert [x.decode() if isinstance(x, bytes) else x for x in res.as_numpy("label")] == \
                [r.prediction for r in want]
            assert list(res.as_numpy("class_id")) == [r.class_id for r in want]
            res = c.infer(emb, [bytes_input("text", TEXTS, binary)],
                          outputs=[th.InferRequestedOutput("embedding", binary_data=binary)])
            got = res.as_numpy("embedding")
            assert got.shape == want_emb.shape and got.dtype == np.float32
            np.testing.assert_allclose(got, want_emb, rtol=1e-4, atol=1e-5)
        meta = c.get_model_metadata(emb)
        assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        assert {"name": "embedding", "datatype": "FP32", "shape": [-1, want_emb.shape[1]]} in meta["outputs"]
        with pytest.raises(InferenceServerException) as e:      # an InputError of the runtime: 400, its code
            c.infer(clf, [bytes_input("text", ["   "])])
        assert status_of(e.value) == 400 and "empty" in str(e.value)
        with pytest.raises(InferenceServerException) as e:      # not UTF-8
            c.infer(clf, [bytes_input("text", [b"\xff\xfe"])])
        assert status_of(e.value) == 400 and "UTF-8" in str(e.value)
    finally:
        c.close()


def test_metrics(client, digits_server):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    images, _ = digit_images(1)
    client.infer("digits-cnn", [bytes_input("image", images)])
    text = urllib.request.urlopen(f"http://{digits_server.http}/metrics", timeout=30).read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"edge_serve_requests", "edge_serve_in_flight", "edge_serve_queue_depth", "edge_serve_rejections",
            "edge_runtime_inference_latency_seconds"} <= set(families)
    ok = [s for s in families["edge_serve_requests"].samples if s.labels.get("status") == "ok"]
    assert ok and ok[0].value >= 1


# -- error mappings over the wire ----------------------------------------------------------------
def test_error_mappings_over_http(client):
    images, _ = digit_images(1)
    cases = [
        (lambda: client.infer("nope", [bytes_input("image", images)]), 404, "no model 'nope'"),
        (lambda: client.infer("digits-cnn", [bytes_input("image", images)], model_version="9"), 404, "version '9'"),
        (lambda: client.infer("digits-cnn", [bytes_input("image", [b"not an image"])]), 400, "decodable"),
        (lambda: client.infer("digits-cnn", [bytes_input("image", images * 501)]), 413, "over the limit of 500"),
        (lambda: client.infer("digits-cnn", [bytes_input("image", images)], timeout=1), 504, "deadline"),
        (lambda: client.infer("digits-cnn", [bytes_input("image", images)],
                              outputs=[th.InferRequestedOutput("nope")]), 400, "unknown output"),
        (lambda: client.infer("digits-cnn", [bytes_input("a", images), bytes_input("b", images)]), 400,
         "takes one input"),
    ]
    for call, status, text in cases:     # tritonclient shows the body's "error"; test_serve_hostile reads "code"
        with pytest.raises(InferenceServerException) as e:
            call()
        assert status_of(e.value) == status and text in str(e.value), (status, text, str(e.value))
    assert client.infer("digits-cnn", [bytes_input("image", images)]).as_numpy("label").shape == (1,)


def test_overload_is_429_never_a_queue(digits_artifact):
    images, _ = digit_images(1)
    with ServerProc(digits_artifact, args=("--max-in-flight", "1", "--max-queue", "0")) as srv:
        c = th.InferenceServerClient(srv.http, concurrency=8)
        try:
            big = [bytes_input("image", images * 400)]
            pending = [c.async_infer("digits-cnn", big) for _ in range(8)]
            statuses = []
            for p in pending:
                try:
                    p.get_result(timeout=120)
                    statuses.append(200)
                except InferenceServerException as exc:
                    statuses.append(status_of(exc))
                    assert "retry later" in str(exc)
            assert 200 in statuses and 429 in statuses and set(statuses) <= {200, 429}, statuses
            assert c.infer("digits-cnn", [bytes_input("image", images)]).as_numpy("label").shape == (1,)
        finally:
            c.close()


def test_token_and_repository(digits_artifact, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(digits_artifact, repo / "digits")
    (repo / "not-an-artifact").mkdir()
    with ServerProc("--repository", str(repo), env={"EDGE_INFER_TOKEN": "s3cret"}) as srv:
        images, _ = digit_images(1)
        c = th.InferenceServerClient(srv.http)
        try:
            assert c.is_server_live() and c.is_server_ready()          # health stays open for probes
            for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                with pytest.raises(InferenceServerException) as e:
                    c.infer("digits-cnn", [bytes_input("image", images)], headers=headers)
                assert status_of(e.value) == 401 and "token" in str(e.value)
                with pytest.raises(InferenceServerException):
                    c.get_model_metadata("digits-cnn", headers=headers)
            ok = {"Authorization": "Bearer s3cret"}
            assert c.infer("digits-cnn", [bytes_input("image", images)], headers=ok).as_numpy("label").shape == (1,)
            assert c.get_model_metadata("digits-cnn", headers=ok)["name"] == "digits-cnn"
        finally:
            c.close()


@pytest.mark.parametrize("args, code", [
    (["--host", "0.0.0.0"], ec.INPUT_INVALID),            # not loopback, no token
    ([], ec.INPUT_MISSING),                                # neither ARTIFACT nor --repository
])
def test_cli_refusals(args, code, digits_artifact):
    extra = [str(digits_artifact)] if args else []
    r = subprocess.run([sys.executable, "-m", "edge_runtime", "serve", *extra, *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and f"[{code}]" in r.stderr, r.stderr


# -- the core, in-process: mappings that need a misbehaving runtime ------------------------------
@pytest.fixture(scope="module")
def core(digits_artifact):
    from edge_runtime.serve_core import ServeCore

    c = ServeCore([digits_artifact], max_in_flight=1, max_queue=1)
    assert not c.ready and c.live
    c.load_all()
    assert c.ready
    yield c
    c.close()


def _req(images):
    return InferRequest("digits-cnn", None, [Tensor("image", "BYTES", [len(images)], images)])


def test_core_error_mapping(core, monkeypatch):
    from edge_runtime.errors import ArtifactError, DeviceError, InferenceRuntimeError, InferenceTimeout
    from edge_runtime.serve_core import serve_error

    images, _ = digit_images(1)
    (m,) = core.models.values()
    for exc, status in ((InferenceRuntimeError("boom"), "internal"), (DeviceError("gone"), "unavailable"),
                        (ArtifactError("bad"), "internal"), (InferenceTimeout("late"), "timeout"),
                        (RuntimeError("bug"), "internal")):
        monkeypatch.setattr(m.rt, "infer_batch", lambda items, exc=exc, **kw: [exc])

        def failing(raw, exc=exc, **kw):       # a one-item request goes through infer
            raise exc

        monkeypatch.setattr(m.rt, "infer", failing)
        with pytest.raises(ServeError) as e:
            asyncio.run(core.infer(_req(images)))
        assert e.value.status == status and HTTP_STATUS[e.value.status] in (500, 503, 504)
        assert e.value.code == getattr(exc, "code", ec.UNEXPECTED)
        assert serve_error(exc).status == status
    assert core.accepted == core.answered


def test_core_backpressure_and_drain(core, monkeypatch):
    import threading

    images, _ = digit_images(1)
    (m,) = core.models.values()
    gate = threading.Event()
    real = m.rt.infer

    def slow(raw, **kw):          # a one-item request: the core calls infer
        gate.wait(10)
        return real(raw, **kw)

    monkeypatch.setattr(m.rt, "infer", slow)
    monkeypatch.setattr(m, "inline", None)        # a blocking call belongs on the pool, never on the loop

    async def scenario():
        first = asyncio.ensure_future(core.infer(_req(images)))       # runs (max_in_flight=1)
        second = asyncio.ensure_future(core.infer(_req(images)))      # waits (max_queue=1)
        await asyncio.sleep(0.2)
        with pytest.raises(ServeError) as e:                          # a third: refused at once
            await core.infer(_req(images))
        assert e.value.status == "overloaded" and HTTP_STATUS["overloaded"] == 429
        drain = asyncio.ensure_future(core.drain(10))
        await asyncio.sleep(0.05)
        assert not core.ready
        with pytest.raises(ServeError) as e:                          # draining: 503
            await core.infer(_req(images))
        assert (e.value.status, e.value.code) == ("unavailable", ec.SERVE_NOT_READY)
        gate.set()
        await drain
        return [await first, await second]

    done = asyncio.run(scenario())
    assert [r.outputs[0].name for r in done] == ["label", "label"]
    assert "edge_serve_rejections_total{reason=\"overloaded\"} 1" in core.metrics_text()


def test_dynamic_batching_merges_requests_on_a_batched_backend(ov_digits_artifact):
    """OpenVINO declares a batch path: concurrent requests within the delay go through one infer_batch."""
    import edge_runtime as er
    from edge_runtime.serve_core import ServeCore

    images, labels = digit_images(8)
    # inline=False: digits is sub-millisecond, and such a model runs on the loop, never batched
    c = ServeCore([ov_digits_artifact], device="openvino", batch_delay_ms=20, max_in_flight=1, verify=False,
                  inline=False)
    try:
        c.load_all()
        (m,) = c.models.values()
        assert m.batched
        calls = []
        real, real_one = m.rt.infer_batch, m.rt.infer
        m.rt.infer_batch = lambda items, **kw: calls.append(len(items)) or real(items, **kw)
        m.rt.infer = lambda raw, **kw: calls.append(1) or real_one(raw, **kw)     # a batch of one

        async def burst():
            return await asyncio.gather(*[c.infer(_req([img])) for img in images])

        got = asyncio.run(burst())
        assert [r.outputs[0].data[0].decode() for r in got] == labels     # each answer is its own item's
        assert sum(calls) == len(images) and max(calls) > 1, calls
        assert c._batched_requests == len(images) and c._batches == len(calls)
    finally:
        c.close()
    with er.load(ov_digits_artifact, device="openvino") as rt:
        assert [r.prediction for r in rt.infer_batch(images)] == labels


def test_imported_artifact_without_probe_set_is_served(coral_artifact):
    """An imported artifact has no probe set: it is served unverified (with a warning), never refused."""
    from conftest import shared
    from edge_runtime.serve_core import ServeCore

    cat = shared("coral", "cat.bmp").read_bytes()
    c = ServeCore([coral_artifact])
    try:
        c.load_all()
        (m,) = c.models.values()
        resp = asyncio.run(c.infer(InferRequest(m.name, None, [Tensor("image", "BYTES", [1], [cat])],
                                                outputs=["label", "result"])))
        assert "cat" in resp.outputs[0].data[0].decode()
        assert resp.outputs[1].name == "result" and b'"top_k"' in resp.outputs[1].data[0]
    finally:
        c.close()
