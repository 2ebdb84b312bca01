"""8 threads x 1,000 ``infer()`` calls on every real backend (ONNX Runtime,
OpenVINO, LiteRT; in process and through the isolated worker), on artifacts
the real converters built and on real inputs: every result must equal the
serial run's for the same input, and no call may fail.

The conformance suite's concurrency check (4 threads x 10 calls) runs on
every backend including the faked ones; this is the long version on the real
ones. The MiniLM text cases (two buckets, the tokenizer path) run 8 x 50
calls: 8,000 would take 3-4 minutes of CI on 2 cores; they are ``slow``."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import edge_runtime as er
from conftest import ZOO, shared

THREADS = 8


def _digits():
    pngs = sorted((ZOO / "digits-cnn" / "held_out").rglob("*.png"))
    return [p.read_bytes() for p in pngs[::23][:16]]         # every class, real held-out digits


def _photos():
    from PIL import Image

    out = []
    for name in ("cat.bmp", "bird.bmp", "parrot.jpg", "grace_hopper.bmp"):
        img = Image.open(shared("coral", name)).convert("RGB")
        img.thumbnail((200, 200))                             # decoded once here; infer() still resizes
        arr = np.asarray(img)
        out += [arr, np.ascontiguousarray(arr[:, ::-1])]
    return out


def _texts():
    lines = (ZOO / "minilm" / "calibration.txt").read_text().splitlines()
    texts = [t for t in lines if t.strip()]
    return texts[:6] + [" ".join(texts[6:12])]            # short ones (seq64) and a long one (seq128)


CASES = [  # id, artifact fixture, device, isolate, inputs, calls per thread
    ("onnxruntime-digits", "digits_artifact", "onnxruntime", False, _digits, 1000),
    ("openvino-digits", "ov_digits_artifact", "openvino", False, _digits, 1000),
    ("tflite-digits", "tflite_digits_artifact", "tflite", False, _digits, 1000),
    ("tflite-coral-photos", "coral_artifact", "tflite", False, _photos, 1000),
    ("onnxruntime-digits-isolated", "digits_artifact", "onnxruntime", True, _digits, 1000),
    pytest.param("onnxruntime-minilm", "minilm_embedding_artifact", "onnxruntime", False, _texts, 50,
                 marks=pytest.mark.slow),
    pytest.param("openvino-minilm", "ov_minilm_embedding_artifact", "openvino", False, _texts, 50,
                 marks=pytest.mark.slow),
]


def _key(res):
    emb = None if res.embedding is None else np.asarray(res.embedding).tobytes()
    return res.prediction, tuple(sorted((res.scores or {}).items())), emb, res.bucket


@pytest.mark.parametrize("cid,fixture,device,isolate,inputs,calls", CASES,
                         ids=[c.values[0] if hasattr(c, "marks") else c[0] for c in CASES])
def test_threads_match_the_serial_run(request, cid, fixture, device, isolate, inputs, calls):
    art = request.getfixturevalue(fixture)
    inputs = inputs()
    with er.load(art, device=device, strict=True, isolate=isolate) as rt:
        serial = [_key(rt.infer(x)) for x in inputs]
        assert len(set(serial)) > 1, "inputs must not all give the same answer"
        errors, mismatches, done = [], [], [0] * THREADS

        def worker(t):
            for i in range(calls):
                k = (t * 7 + i) % len(inputs)
                try:
                    got = _key(rt.infer(inputs[k]))
                except Exception as exc:  # recorded, asserted below
                    errors.append(f"thread {t} call {i}: {type(exc).__name__}: {exc}")
                    continue
                if got != serial[k]:
                    mismatches.append((t, i, k))
                done[t] += 1

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
        [t.start() for t in threads]
        [t.join(600) for t in threads]
        assert not any(t.is_alive() for t in threads), "a thread hung"
        assert not errors, errors[:5]
        assert not mismatches, f"{len(mismatches)} results differ from the serial run, first {mismatches[:5]}"
        assert sum(done) == THREADS * calls
        hist = rt.metrics()["latency_seconds"]
        assert sum(h["count"] for h in hist.values()) == THREADS * calls + len(inputs)
