"""``edge-infer bench`` must not lie about what ran where: the raw side runs with the thread count
ours runs with when it comes from ``$EDGE_RUNTIME_THREADS``, on the providers/device ours runs on,
and the device the raw side ran on is named beside ours."""

import json
from types import SimpleNamespace

from click.testing import CliRunner

from edge_runtime import benchmark
from edge_runtime.cli import main


def test_raw_side_gets_the_env_thread_count_ours_runs_with(digits_artifact, monkeypatch):
    # $EDGE_RUNTIME_THREADS sets our sessions' threads (and switches threads_fit off); the raw runner
    # got no count and ran onnxruntime's default (all physical cores) against our one thread
    monkeypatch.setenv("EDGE_RUNTIME_THREADS", "1")
    seen = []
    real = benchmark.raw_runner

    def spy(backend, path, bucket, options):
        seen.append(dict(options))
        return real(backend, path, bucket, options)

    monkeypatch.setattr(benchmark, "raw_runner", spy)
    d = benchmark.run_bench(digits_artifact, calls=2, repeats=1, cold=False)
    assert seen and all(o.get("threads") == 1 for o in seen), seen
    assert d["threads"] == 1 and d["raw_options"]["threads"] == 1


def test_raw_side_runs_on_the_providers_ours_runs_on():
    sess = SimpleNamespace(threads=4, providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
                           provider_options={"CUDAExecutionProvider": {"device_id": 0}, "CPUExecutionProvider": {}})
    rt = SimpleNamespace(device_options={}, threads_fit=None, _sessions=[sess])
    opts = benchmark.raw_options(rt, 0)
    assert opts["providers"] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert opts["provider_options"]["CUDAExecutionProvider"] == {"device_id": "0"}
    assert opts["threads"] == 4
    ov = SimpleNamespace(precision="f32", _tp_device="GPU")
    assert benchmark.raw_options(SimpleNamespace(device_options={}, _sessions=[ov]), 0)["ov_device"] == "GPU"


def test_ort_raw_runner_uses_the_providers_given_and_names_its_device():
    from conftest import shared
    from edge_runtime.bench_raw import OrtRaw

    model = shared("onnx_node", "test_relu", "model.onnx")
    raw = OrtRaw(str(model), {"providers": ["CPUExecutionProvider"], "provider_options": {}})
    assert raw.sess.get_providers() == ["CPUExecutionProvider"] and raw.device == "onnxruntime:cpu"


class _OtherDeviceRaw:
    device = "onnxruntime:cuda"

    def run(self, feeds):
        return []

    def run_async(self, feeds_list, concurrency=2):
        return [self.run(f) for f in feeds_list]


def test_the_raw_device_is_named_and_a_different_one_is_flagged(digits_artifact, monkeypatch):
    res = CliRunner().invoke(main, ["bench", str(digits_artifact), "--calls", "2", "--repeats", "1", "--no-cold",
                                    "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output[res.output.index("{"):])
    assert d["raw_device"] == d["device"] and "raw_device_differs" not in d
    monkeypatch.setattr(benchmark, "raw_runner", lambda *a, **k: _OtherDeviceRaw())
    res = CliRunner().invoke(main, ["bench", str(digits_artifact), "--calls", "2", "--repeats", "1", "--no-cold"])
    assert res.exit_code == 0, res.output
    assert "raw: onnxruntime on onnxruntime:cuda" in res.output
    assert "the raw side ran on onnxruntime:cuda, ours on onnxruntime:cpu" in res.output


def test_peak_rss_from_ru_maxrss_is_kib_on_macos_too(tmp_path, monkeypatch):
    # without /proc the children read ru_maxrss, which macOS counts in bytes: 60 MiB read as 60 GiB
    import resource

    from edge_runtime.bench_raw import peak_rss_kb

    fake = SimpleNamespace(ru_maxrss=60 * 1024 * 1024)
    monkeypatch.setattr(resource, "getrusage", lambda who: fake)
    absent = str(tmp_path / "no-proc-status")
    assert peak_rss_kb(absent, "darwin") == 60 * 1024
    fake.ru_maxrss = 60 * 1024                                   # Linux and the BSDs: KiB already
    assert peak_rss_kb(absent, "linux") == 60 * 1024
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t   70000 kB\n")
    assert peak_rss_kb(str(status), "linux") == 70000


def test_run_bench_refuses_zero_calls_or_rounds_with_a_typed_error(text_art):
    import pytest

    from edge_runtime.errors import InputError

    for kw in ({"calls": 0}, {"repeats": 0}, {"batch": 0}, {"concurrency": 0}, {"calls": -3}):
        with pytest.raises(InputError) as e:
            benchmark.run_bench(text_art, cold=False, **kw)
        assert e.value.code == "input_invalid" and next(iter(kw)) in str(e.value)


def test_a_failed_cold_start_child_is_a_typed_error(text_art, monkeypatch):
    import subprocess

    import pytest

    from edge_runtime.errors import InferenceRuntimeError

    monkeypatch.setattr(benchmark.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, stdout="", stderr="Traceback ...\nMemoryError"))
    with pytest.raises(InferenceRuntimeError, match="(?s)ours cold-start child failed.*MemoryError") as e:
        benchmark.run_bench(text_art, calls=1, repeats=1)
    assert e.value.code == "inference_failed"
    res = CliRunner().invoke(main, ["bench", str(text_art), "--calls", "1", "--repeats", "1"])
    assert res.exit_code == 6 and "inference_failed" in res.output, res.output
