"""The openvino target: NNCF int8 IR converter and the openvino backend.

Fidelity is measured on real models (digits-cnn, all-MiniLM-L6-v2 and its
SST-2 head) against their fp32 ONNX sources on ONNX Runtime.
"""

import json
import time

import numpy as np
import pytest

import edge_runtime as er
from conftest import ZOO, need_openvino, shared

need_openvino()


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def _fp32_digits_accuracy(rt):
    """Accuracy of the fp32 source ONNX through the artifact's own pre-processing."""
    import onnxruntime as ort
    from edge_runtime.evaluate import labelled_samples

    sess = ort.InferenceSession(str(ZOO / "digits-cnn" / "model.onnx"), providers=["CPUExecutionProvider"])
    ok = n = 0
    for path, label in labelled_samples(ZOO / "digits-cnn" / "held_out"):
        p = rt.task.prepare(path, rt.limits)
        logits = sess.run(None, p.feeds)[0][0]
        ok += rt.task.labels[int(logits.argmax())] == label
        n += 1
    return ok / n


# -- converter ---------------------------------------------------------------

def test_one_artifact_with_both_variants(ov_digits_artifact):
    man = _manifest(ov_digits_artifact)
    assert [v["target"] for v in man["variants"]] == ["openvino", "onnx-int8"]
    ov_variant = man["variants"][0]
    bucket = ov_variant["buckets"][0]
    assert bucket["file"] == "openvino/static.xml" and bucket["extra_files"] == ["openvino/static.bin"]
    for rel in [bucket["file"], *bucket["extra_files"]]:
        assert len(man["files"][rel]["sha256"]) == 64
    assert bucket["inputs"] == [{"name": "image", "dtype": "float32", "shape": [1, 1, 8, 8]}]
    q = ov_variant["quantization"]
    assert q["recipe"] == "cnn" and q["fake_quantize_ops"] > 0 and q["calibration"]["samples"] == 200
    assert {"openvino", "nncf", "numpy"} <= set(ov_variant["toolchain"])
    for v in man["variants"]:
        assert v["parity"]["passed"] and v["parity"]["value"] >= 0.99 and v["parity"]["samples"] == 360


def test_ir_weights_are_not_silently_fp16(ov_digits_artifact):
    import openvino as ov

    model = ov.Core().read_model(str(ov_digits_artifact / "openvino" / "static.xml"))
    consts = [op for op in model.get_ops() if op.get_type_name() == "Constant"]
    types = {str(op.get_element_type()) for op in consts}
    assert not any("f16" in t for t in types), types


def test_digits_fidelity(ov_digits_artifact):
    from edge_runtime.evaluate import evaluate

    with er.load(ov_digits_artifact, device="openvino", strict=True) as rt:
        rep = evaluate(rt, ZOO / "digits-cnn" / "held_out")
        fp32 = _fp32_digits_accuracy(rt)
    assert rep["device"] == "openvino:cpu" and rep["samples"] == 360 and not rep["errors"]
    assert rep["parity"]["value"] >= 0.99                      # top-1 agreement int8 vs fp32
    assert abs(rep["accuracy"] - fp32) <= 0.01                  # within one point of fp32
    assert fp32 > 0.97


def test_a_tampered_weights_file_is_refused(ov_digits_artifact, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(ov_digits_artifact, bad)
    blob = bad / "openvino" / "static.bin"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))
    with pytest.raises(er.ArtifactError) as ei:
        er.load(bad, device="openvino")
    assert ei.value.details.get("file") == "openvino/static.bin" or "static.bin" in ei.value.message
    # the other variant does not run on those bytes, but the artifact is one snapshot: its
    # load verifies them while ONNX Runtime loads, and refuses too; `inspect` refuses as well
    with pytest.raises(er.ArtifactError) as ei:
        er.load(bad, device="onnxruntime", strict=True)
    assert ei.value.details.get("file") == "openvino/static.bin"
    from test_cli import cli

    proc = cli("inspect", bad)
    assert proc.returncode == 3 and "static.bin" in proc.stderr


def test_accuracy_control_recipe(tmp_path):
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    man = convert(convert_request("digits-cnn", "image-classification", tmp_path / "ac", targets=["openvino"],
                                  recipe="accuracy-control", min_parity=0.995))
    v = man["variants"][0]
    ac = v["quantization"]["accuracy_control"]
    assert v["quantization"]["recipe"] == "accuracy-control"
    assert ac["metric"] == "top1_agreement" and ac["max_drop"] == pytest.approx(0.005)
    assert ac["validation_samples"] == 200                      # the calibration split, never the held-out set
    assert v["parity"]["value"] >= 0.995


@pytest.mark.parametrize("kw,needle", [
    ({"recipe": "no-such-recipe"}, "no target knows recipe"),
    ({"recipe_overrides": {"bogus": 1}}, "unknown openvino recipe override"),
    ({"recipe_overrides": {"activation_range": "nope"}}, "activation_range"),
    ({"recipe_overrides": {"float_matmuls": ["everything"]}}, "float_matmuls"),
])
def test_bad_recipe_is_an_input_error(tmp_path, kw, needle):
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    with pytest.raises(er.InputError) as ei:
        convert(convert_request("digits-cnn", "image-classification", tmp_path / "x", targets=["openvino"], **kw))
    assert needle in ei.value.message and ei.value.code == "convert_recipe_invalid"
    assert not (tmp_path / "x").exists()


def test_per_target_recipes(tmp_path):
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    man = convert(convert_request("digits-cnn", "image-classification", tmp_path / "x",
                                  targets=["openvino", "onnx-int8"], recipe="openvino=accuracy-control,onnx-int8=cnn"))
    assert [v["quantization"]["recipe"] for v in man["variants"]] == ["accuracy-control", "cnn"]


# -- backend -----------------------------------------------------------------

def test_openvino_preferred_on_x86_when_both_are_present(ov_digits_artifact):
    from edge_runtime.hardware import detect

    hw = detect()
    if hw["machine"] not in ("x86_64", "AMD64") or "avx2" not in hw["cpu"]["features"]:
        pytest.skip("not an x86-64 AVX2 CPU")
    with er.load(ov_digits_artifact) as rt:
        assert (rt.info()["backend"], rt.device) == ("openvino", "openvino:cpu")
    intel = json.loads(json.dumps(hw))
    intel["cpu"]["vendor"] = "GenuineIntel"
    with er.load(ov_digits_artifact, hardware=intel) as rt:
        assert rt.variant["target"] == "openvino" and "Intel" in rt.info()["device_reason"]
    arm = {**hw, "machine": "aarch64", "cpu": {**hw["cpu"], "vendor": "", "features": ["neon"]}}
    with er.load(ov_digits_artifact, hardware=arm) as rt:
        assert rt.variant["target"] == "onnx-int8"              # ORT is the better CPU path there
    absent = {**hw, "packages": {**hw["packages"], "openvino": False}}
    with er.load(ov_digits_artifact, hardware=absent) as rt:
        assert rt.variant["target"] == "onnx-int8"
        assert any("not installed" in c["reason"] for c in rt.info()["candidates"])


def test_missing_device_is_typed(ov_digits_artifact):
    with pytest.raises(er.DeviceError) as ei:
        er.load(ov_digits_artifact, device="openvino:npu", strict=True)
    assert "NPU" in ei.value.message
    with er.load(ov_digits_artifact, device="openvino:npu") as rt:   # not strict: falls back, says why
        assert rt.choice.fallback and "NPU" in rt.choice.fallback


def test_info_records_precision_hint_and_cache(ov_digits_artifact, tmp_path):
    cache = tmp_path / "ovcache"
    man = _manifest(ov_digits_artifact)
    variant = man["variants"][0]
    recorded = variant.get("runtime", {}).get("precision", "f32")
    with er.load(ov_digits_artifact, device="openvino", device_options={"cache_dir": str(cache)}) as rt:
        s = rt.info()["sessions"][0]
        assert s["precision_requested"] == recorded
        assert s["precision"] == {"f32": "float32", "bf16": "bfloat16"}[recorded]
        assert s["cache_dir"] == str(cache) and s["infer_requests"] >= 1
    # the converter measured each candidate precision and recorded why it chose
    trials = variant.get("runtime_trials") or []
    assert trials and trials[0]["options"] == {"precision": "f32"}
    assert all(t["device_ms_median"] > 0 and t["parity"] >= 0.99 for t in trials)
    with er.load(ov_digits_artifact, device="openvino", device_options={"precision": "f32", "cache": False}) as rt:
        s = rt.info()["sessions"][0]
        assert (s["precision"], s["precision_reason"]) == ("float32", "requested")
    assert any(cache.iterdir())                                  # compiled blob written
    with er.load(ov_digits_artifact, device="openvino", device_options={"cache": False}) as rt:
        assert rt.info()["sessions"][0]["cache_dir"] is None


def test_an_unusable_cache_dir_is_not_fatal(ov_digits_artifact, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with er.load(ov_digits_artifact, device="openvino", device_options={"cache_dir": str(blocker / "ov")}) as rt:
        s = rt.info()["sessions"][0]
        assert s["cache_dir"] is None and "model cache off" in s["cache_error"]
        assert rt.infer(np.zeros((8, 8), np.uint8)).prediction in rt.task.labels


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    from edge_runtime.devices.openvino_backend import cache_dir

    monkeypatch.setenv("EDGE_RUNTIME_CACHE_DIR", str(tmp_path))
    assert cache_dir({}) == tmp_path / "openvino"
    monkeypatch.setenv("EDGE_RUNTIME_OV_CACHE", "0")
    assert cache_dir({}) is None


def test_bf16_on_request_when_the_cpu_has_it(ov_digits_artifact):
    import openvino as ov

    if "BF16" not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        pytest.skip("CPU plugin has no bf16 here")
    with er.load(ov_digits_artifact, device="openvino", device_options={"precision": "bf16", "cache": False}) as rt:
        s = rt.info()["sessions"][0]
        assert s["precision"] == "bfloat16" and s["precision_reason"] == "requested"
    with pytest.raises(er.InputError) as ei:          # a bad value of a declared option: the caller's error
        er.load(ov_digits_artifact, device="openvino", device_options={"precision": "int3"})
    assert ei.value.code == "device_option_invalid" and "auto, f32, bf16, f16" in ei.value.message


def test_infer_batch_runs_on_the_throughput_queue(ov_digits_artifact):
    from edge_runtime.evaluate import labelled_samples

    paths = [p for p, _ in labelled_samples(ZOO / "digits-cnn" / "held_out")][:64]
    with er.load(ov_digits_artifact, device="openvino", strict=True) as rt:
        singles = [rt.infer(p) for p in paths]
        batch = rt.infer_batch(paths + ["/no/such/image.png"])
        assert rt.info()["sessions"][0]["throughput_compiled"]
        assert isinstance(batch[-1], er.InputError)
        for a, b in zip(singles, batch):
            assert a.prediction == b.prediction
            for k in a.scores:
                assert abs(a.scores[k] - b.scores[k]) < 1e-5
        # a deadline the batch cannot meet: every item is a typed timeout, then it keeps serving
        late = rt.infer_batch(paths * 7, deadline_ms=0.001)
        assert all(isinstance(r, (er.InferenceTimeout, er.InferenceResult)) for r in late)
        assert any(isinstance(r, er.InferenceTimeout) for r in late)
        again = rt.infer_batch(paths[:4])
        assert [r.prediction for r in again] == [r.prediction for r in singles[:4]]


# -- fidelity and deadlines on MiniLM (slow) --------------------------------------

def _fp32_embeddings(src, texts, length=128):
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.no_padding()                      # the file pads to 128 by itself
    tok.enable_truncation(max_length=length)
    sess = ort.InferenceSession(str(src / "embedding.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for text in texts:
        ids = np.array([tok.encode(text).ids])
        h = sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                            "token_type_ids": np.zeros_like(ids)})[0][0]
        v = h.mean(0)
        out.append(v / np.linalg.norm(v))
    return out


@pytest.mark.slow
def test_minilm_embedding_fidelity(ov_minilm_embedding_artifact, minilm_sources):
    man = _manifest(ov_minilm_embedding_artifact)
    par = man["variants"][0]["parity"]
    from conftest import INT8_DOT

    floor = 0.99 if INT8_DOT else 0.985     # AVX2 without VNNI: u8*s8 saturation; measured min 0.9896 there
    assert par["value"] >= 0.995 and par["min"] >= floor and set(par["per_bucket"]) == {"seq64", "seq128"}
    # and on real third-party sentences the converter never saw
    rows = shared("text", "sst2", "dev.tsv").read_text().splitlines()[1:]
    texts = [r.rsplit("\t", 1)[0] for r in rows[::4]]
    refs = _fp32_embeddings(minilm_sources, texts)
    with er.load(ov_minilm_embedding_artifact, device="openvino", strict=True) as rt:
        cos = [float(rt.infer(t).embedding @ r) for t, r in zip(texts, refs)]
    assert np.mean(cos) >= 0.995 and np.min(cos) >= floor, (np.mean(cos), np.min(cos))


@pytest.mark.slow
def test_minilm_classifier_sst2_drop(ov_minilm_classifier_artifact, minilm_sources):
    from test_minilm import _fp32_accuracy

    from edge_runtime.evaluate import evaluate

    sst = shared("text", "sst2", "dev.tsv")
    man = _manifest(ov_minilm_classifier_artifact)
    v = man["variants"][0]
    assert v["parity"]["passed"] and v["parity"]["value"] >= 0.99
    trials = v["recipe_trials"]         # built with --recipe auto: every trial on record, the last one kept
    assert trials[-1]["kept"] and v["quantization"]["recipe_auto"]["kept"] == trials[-1]["recipe"]
    assert all(t["passed"] is False for t in trials[:-1])
    with er.load(ov_minilm_classifier_artifact, device="openvino", strict=True) as rt:
        rep = evaluate(rt, sst)
    fp32 = _fp32_accuracy(minilm_sources, sst)
    assert rep["samples"] == 872 and not rep["errors"]
    assert rep["accuracy"] >= fp32 - 0.005, (rep["accuracy"], fp32)   # at most half a point


@pytest.mark.slow
def test_minilm_infer_batch_is_infer_on_the_throughput_queue(ov_minilm_embedding_artifact):
    # the batch path tokenizes the batch in one call and runs it on the THROUGHPUT queue of twice
    # the optimal requests: the same buckets, truncation and embeddings as infer() one by one
    texts = ["a short one", "a longer sentence about the weather " * 6, "word " * 300, "", "ünïcödé ✓"]
    with er.load(ov_minilm_embedding_artifact, device="openvino", strict=True) as rt:
        batch = rt.infer_batch(texts)
        assert isinstance(batch[3], er.InputError) and batch[3].code == "input_empty"
        for t, b in zip(texts, batch):
            if not t:
                continue
            one = rt.infer(t)
            assert (b.bucket, b.truncated, b.input_length) == (one.bucket, one.truncated, one.input_length)
            assert float(np.dot(b.embedding, one.embedding)) > 0.999
        assert batch[2].truncated and batch[2].bucket == "seq128"
        for info, sess in zip(rt.info()["sessions"], rt._sessions):     # both buckets got items
            optimal = sess._tp[0].get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
            assert info["throughput_compiled"] and info["batch_jobs"] == 2 * optimal


@pytest.mark.slow
def test_deadline_cancels_a_running_openvino_call(ov_minilm_embedding_artifact):
    with er.load(ov_minilm_embedding_artifact, device="openvino", strict=True) as rt:
        text = "shares rose sharply after the earnings report " * 12      # seq128
        full = min(rt.infer(text).latency_ms for _ in range(3))
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            with pytest.raises(er.InferenceTimeout) as ei:
                rt.infer(text, deadline_ms=full / 4)
            times.append((time.perf_counter() - t0) * 1000)
            # "did not answer": InferRequest.cancel() made the running call raise (a call that ran to
            # the end would say "answered after the deadline"), every time
            assert "did not answer" in ei.value.message
        # The time bound has scheduler slack: on an AMX box a full call is 4.5 ms, and a 1 ms hiccup
        # once put a cancelled call at 5.3 ms; in a CI run on the 2-core EPYC one attempt took 88 ms
        # (full 9 ms): the best of three must be within it, a cancel that never works fails all three
        assert min(times) < full + 10, times
        assert rt.infer(text).bucket == "seq128"


# -- CLI ---------------------------------------------------------------------

def test_cli_runs_both_variants_and_takes_device_options(ov_digits_artifact):
    from test_cli import cli

    img = sorted((ZOO / "digits-cnn" / "held_out" / "3").iterdir())[0]
    out = json.loads(cli("infer", ov_digits_artifact, "--image", img, "--json", check=0).stdout)
    assert (out["device"], out["target"], out["prediction"]) == ("openvino:cpu", "openvino", "3")
    out = json.loads(cli("infer", ov_digits_artifact, "--image", img, "--device", "onnxruntime",
                         "--require-device", "--json", check=0).stdout)
    assert (out["device"], out["target"]) == ("onnxruntime:cpu", "onnx-int8")
    rep = json.loads(cli("eval", ov_digits_artifact, ZOO / "digits-cnn" / "held_out", "--device-option",
                         "precision=f32", "--device-option", "cache=false", "--json", check=0).stdout)
    assert rep["device"] == "openvino:cpu" and rep["accuracy"] > 0.97
    bad = cli("infer", ov_digits_artifact, "--image", img, "--device-option", "precision")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
    bad = cli("infer", ov_digits_artifact, "--image", img, "--device", "openvino", "--device-option", "precision=int3")
    assert bad.returncode == 2 and "int3" in bad.stderr and "device_option_invalid" in bad.stderr


def test_warm_batch_compiles_the_throughput_path_before_a_batch_job(ov_digits_artifact):
    """`edge-infer score` calls rt.warm_batch() before its clock starts: the THROUGHPUT
    compile is load time (it cost ~35% of a 384-text MiniLM score run's loop)."""
    with er.load(ov_digits_artifact, device="openvino", strict=True) as rt:
        assert rt.info()["sessions"][0]["throughput_compiled"] is False     # infer()-only apps never pay
        ms = rt.warm_batch()
        assert set(ms) == {"static"} and ms["static"] > 0 and rt.info()["warmup_ms"]["batch:static"] == ms["static"]
        assert rt.info()["sessions"][0]["throughput_compiled"] is True
        paths = sorted(str(p) for p in (ZOO / "digits-cnn" / "held_out").rglob("*.png"))[:8]
        assert [r.prediction for r in rt.infer_batch(paths)] == [rt.infer(p).prediction for p in paths]
    with er.load(ov_digits_artifact, device="onnxruntime", strict=True) as rt:
        assert rt.warm_batch() == {}           # no separate throughput path: nothing to do


def test_a_recorded_precision_that_does_not_compile_here_falls_back_to_f32(ov_digits_artifact, monkeypatch):
    """An artifact records the precision its build host measured fastest (bf16 on a BF16 CPU); a CPU
    whose plugin has no kernels for it (an AVX2-only laptop; oneDNN capped by ONEDNN_MAX_CPU_ISA)
    must still load it, at f32, saying why. A precision the *caller* asked for stays an error."""
    from edge_runtime.devices import openvino_backend as ovb

    real = ovb.core()

    class NoBf16Core:
        def __getattr__(self, name):
            return getattr(real, name)

        def compile_model(self, model, device, config):
            if config.get("INFERENCE_PRECISION_HINT") == "bf16":
                raise RuntimeError("Exception from src/plugins/intel_cpu/src/node.cpp:345:\n"
                                   "Supported primitive descriptors list is empty for node: Softmax_1 type: Softmax")
            return real.compile_model(model, device, config)

    monkeypatch.setattr(ovb, "core", lambda: NoBf16Core())
    bucket = next(v for v in _manifest(ov_digits_artifact)["variants"] if v["target"] == "openvino")["buckets"][0]
    xml = ov_digits_artifact / bucket["file"]
    sess = ovb.OpenVinoSession(xml, bucket, "cpu", {"precision": "bf16", "cache": False},
                               "measured fastest on the build host")
    try:
        assert sess.precision == "f32"
        assert "recorded bf16" in sess.precision_reason and "did not compile here" in sess.precision_reason
    finally:
        sess.close()
    with pytest.raises(RuntimeError):           # asked for by the caller (no recorded reason): not silently changed
        ovb.OpenVinoSession(xml, bucket, "cpu", {"precision": "bf16", "cache": False}, None)


def test_a_cache_failure_falls_back_and_a_model_that_never_compiles_does_not_blame_the_cache(monkeypatch):
    """A compile that fails with CACHE_DIR is retried without it: the cache is blamed (one log
    line) only when the retry compiles; a model that fails both ways raises its own error."""
    from edge_runtime.devices import openvino_backend as ob

    calls = []

    class Core:
        def __init__(self, fail_always):
            self.fail_always = fail_always

        def compile_model(self, model, device, config):
            calls.append(dict(config))
            if self.fail_always or "CACHE_DIR" in config:
                raise RuntimeError("Exception from src/inference:\nbroken\nthing")
            return "compiled"

    def session():
        s = ob.OpenVinoSession.__new__(ob.OpenVinoSession)
        s._model, s._config, s.cache, s.cache_error = "model", {"CACHE_DIR": "/c", "X": 1}, "/c", None
        return s

    monkeypatch.setattr(ob, "core", lambda: Core(False))
    s = session()
    assert s._compile_latency("CPU") == "compiled" and s.cache is None and "CACHE_DIR" not in s._config
    assert "\n" not in s.cache_error and "broken thing" in s.cache_error
    monkeypatch.setattr(ob, "core", lambda: Core(True))
    s = session()
    with pytest.raises(RuntimeError, match="broken"):
        s._compile_latency("CPU")
    assert s.cache_error is None and s._config["CACHE_DIR"] == "/c"
