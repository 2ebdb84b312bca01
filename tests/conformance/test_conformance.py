"""One conformance suite; every device backend runs all of it."""

import json
import threading

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime.devices import registry
from edge_runtime.devices.base import Backend, BatchSession, Capabilities, Option, Session
from edge_runtime.watchdog import CancelToken
from edge_runtime.selection import choose, same_device

from .cases import CASES

# cases that export and convert MiniLM: marked at collection, so `-m "not slow"` deselects them
SLOW = {"onnxruntime-minilm-embed", "onnxruntime-minilm-cls", "openvino-minilm-embed", "openvino-minilm-cls",
        "coreml-faked-minilm-embed", "coreml-faked-minilm-cls"}


@pytest.fixture(params=[pytest.param(c, id=c[0], marks=[pytest.mark.slow] if c[0] in SLOW else []) for c in CASES])
def case(request, make_artifact, tmp_path):
    cid, device, (kind, what, *extra), inputs = request.param
    if kind == "factory":
        path = make_artifact(what, **(extra[0] if extra else {}))
    elif kind == "builder":
        path = what(tmp_path)
    else:
        path = request.getfixturevalue(what)
    rt = er.load(path, device=device, strict=True)
    yield device, rt, inputs
    rt.close()


def same(a, b):
    assert a.prediction == b.prediction
    assert a.scores == b.scores
    if a.embedding is not None:
        np.testing.assert_array_equal(a.embedding, b.embedding)
    if a.outputs is not None:
        for k in a.outputs:
            np.testing.assert_array_equal(a.outputs[k], b.outputs[k])


def test_protocol_and_choice(case):
    device, rt, _ = case
    backend = registry.get_backend(device)
    assert isinstance(backend, Backend)
    assert all(isinstance(s, Session) for s in rt._sessions)
    assert not backend.suitability("no-such-target", rt.hardware).ok
    info = rt.info()
    assert info["backend"] == device and info["device"].startswith(device)
    assert info["fallback"] is None
    warmed = {b["name"] for b in info["buckets"]}
    if rt.task.warmup_sample() is not None:
        warmed.add("pipeline")      # pre/post-processing warmed too, not only the device
    assert set(info["warmup_ms"]) == warmed
    json.dumps(info, default=str)


def test_result_contract(case):
    device, rt, inputs = case
    man = rt.artifact.manifest
    results = [rt.infer(x) for x in inputs]
    for res in results:
        assert res.device == rt.device and res.device.startswith(device)
        assert res.target == rt.variant["target"]
        assert (res.model, res.version) == (man["model"]["name"], man["model"]["version"])
        assert res.latency_ms > 0 and res.bucket in {b["name"] for b in rt.variant["buckets"]}
        d = json.loads(json.dumps(res.to_dict()))
        assert d["device"] == res.device
        if man["task"] in ("text-classification", "image-classification"):
            assert res.prediction in rt.task.labels
            assert abs(sum(res.scores.values()) - 1) < 1e-3 or len(res.scores) < len(rt.task.labels)
            assert res.prediction == max(res.scores, key=res.scores.get)
        if man["task"] == "text-embedding":
            assert res.prediction is None and abs(np.linalg.norm(res.embedding) - 1) < 1e-4
    assert len({r.trace_id for r in results}) == len(results)
    with pytest.raises(dataclasses_frozen()):
        results[0].prediction = "other"


def dataclasses_frozen():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_deterministic_and_batch_matches_single(case):
    _, rt, inputs = case
    singles = [rt.infer(x) for x in inputs]
    for a, b in zip(singles, [rt.infer(x) for x in inputs]):
        same(a, b)
    batch = rt.infer_batch(list(inputs) + [object()])
    assert isinstance(batch[-1], er.InputError)
    for a, b in zip(singles, batch):
        same(a, b)


def test_concurrent_calls_match_serial(case):
    _, rt, inputs = case
    serial = [rt.infer(x) for x in inputs]
    errors, out = [], {}

    def worker(t):
        try:
            out[t] = [[rt.infer(x) for x in inputs] for _ in range(10)]
        except Exception as exc:  # recorded, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert not errors
    for rounds in out.values():
        for results in rounds:
            for a, b in zip(serial, results):
                same(a, b)


def test_bad_input_then_keeps_serving(case):
    _, rt, inputs = case
    with pytest.raises(er.InputError):
        rt.infer(object())
    assert rt.infer(inputs[0]).latency_ms > 0


def test_session_guards_its_feeds(case):
    _, rt, _ = case
    with pytest.raises(Exception):
        rt._sessions[0].run({"wrong": np.zeros(1, np.float32)})


def test_close_is_idempotent_and_final(case):
    _, rt, inputs = case
    rt.close()
    rt.close()
    with pytest.raises(er.InferenceRuntimeError) as ei:
        rt.infer(inputs[0])
    assert ei.value.code == "runtime_closed"
    # a batch after close is refused whole on every backend (it was one error per item on
    # unbatched backends and a raise on OpenVINO's batched path)
    with pytest.raises(er.InferenceRuntimeError) as ei:
        rt.infer_batch(list(inputs[:2]))
    assert ei.value.code == "runtime_closed"


# -- selection and strict mode ------------------------------------------------
def test_choice_is_in_the_candidate_table_and_kept_by_the_session(case):
    device, rt, _ = case
    info = rt.info()
    (chosen,) = [c for c in info["candidates"] if c["chosen"]]
    assert chosen["backend"] == info["backend"] == device and chosen["forced"] and chosen["score"] > 0
    assert chosen["target"] == info["target"] and chosen["reason"] == info["device_reason"]
    assert same_device(chosen["device"], info["device"])       # the session runs where its backend promised
    auto = choose(rt.artifact.variants, rt.hardware)             # auto takes the table's best score
    assert auto.suitability.score == max(c["score"] for c in auto.candidates) and auto.fallback is None


def test_a_sub_device_outside_the_vocabulary_is_unknown_strict_or_not(case):
    # a typo is no device on any machine: it is refused, never a fallback to another device (before
    # 2026-12-07 it fell back with a warning and exit 0); a known device this host lacks falls back
    # (tests/test_selection.py, test_cli_devices.py)
    device, rt, _ = case
    for strict in (True, False):
        with pytest.raises(er.DeviceError) as ei:
            er.load(rt.artifact.root, device=f"{device}:no-such-device", strict=strict, warmup=False)
        assert ei.value.code == "device_unknown" and "no-such-device" in ei.value.message


# -- the declared contract: capabilities, batch protocol, cancel token, options ----------------
def test_capabilities_are_declared_frozen_and_honest(case):
    import dataclasses
    import inspect

    _, rt, inputs = case
    for sess, caps in zip(rt._sessions, rt.capabilities):
        assert isinstance(caps, Capabilities) and sess.capabilities is caps      # read once, never replaced
        with pytest.raises(dataclasses.FrozenInstanceError):
            caps.inline = not caps.inline
        assert "cancel" in inspect.signature(sess.run).parameters
        if caps.batched:                       # the batch protocol is there exactly when declared
            assert isinstance(sess, BatchSession)
        assert caps.batched or not caps.batch_warmup
        assert sess.fallback is None or isinstance(sess.fallback, str)
    prepared = rt.task.prepare(inputs[0], rt.limits)
    sess = rt._sessions[prepared.bucket]
    plain = sess.run(prepared.feeds)
    with_token = sess.run(prepared.feeds, cancel=CancelToken())       # an unfired token changes nothing
    assert plain.keys() == with_token.keys()
    for k in plain:
        np.testing.assert_array_equal(plain[k], with_token[k])
    if rt.capabilities[prepared.bucket].batched:
        many = sess.run_many([prepared.feeds, prepared.feeds])
        for out in many:
            for k in plain:
                np.testing.assert_array_equal(plain[k], out[k])
    json.dumps(rt.info()["capabilities"])


def test_options_are_declared_and_validated(case):
    device, rt, _ = case
    backend = registry.get_backend(device)
    assert isinstance(backend.options, tuple) and all(isinstance(o, Option) and o.help for o in backend.options)
    assert len({o.name for o in backend.options}) == len(backend.options)
    with pytest.raises(er.InputError) as ei:
        er.load(rt.artifact.root, device=device, strict=True, warmup=False,
                device_options={"no_such_option_xyz": 1})
    assert ei.value.code == "device_option_unknown" and ei.value.exit_code == 2
    for o in backend.options:
        assert o.name in ei.value.message                     # the valid ones are named
    assert ei.value.details["valid"] == sorted(o.name for o in backend.options)
