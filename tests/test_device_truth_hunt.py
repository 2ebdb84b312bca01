"""Where it ran, said truly: Core ML compute units, a package Core ML cannot load on a unit, an
image-typed Core ML input, and OpenVINO AUTO switching devices after load (the hunt).

Core ML cannot run here: its boundary is a stub module (``models.MLModel``, ``ComputeUnit``)
whose models carry a real Core ML spec (coremltools' protobuf). OpenVINO runs on this CPU; its
AUTO plugin's device switch is faked by a Core that compiles on the CPU and answers AUTO's
properties (EXECUTION_DEVICES "(CPU)" while the chosen device compiles, then "GPU.0")."""

import types

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime.devices.coreml_backend import CoremlBackend

MAC = {"system": "Darwin", "machine": "arm64", "cpu": {}, "packages": {"coremltools": True}}


# -- Core ML: a stub boundary ----------------------------------------------------------------------
class _ComputeUnit:
    ALL, CPU_AND_NE, CPU_ONLY, CPU_AND_GPU = "ALL", "CPU_AND_NE", "CPU_ONLY", "CPU_AND_GPU"


def _spec(image: bool = False, shape=(1, 4), name="x"):
    pytest.importorskip("coremltools")
    from coremltools.proto import FeatureTypes_pb2 as ft
    from coremltools.proto import Model_pb2

    spec = Model_pb2.Model()
    f = spec.description.input.add()
    f.name = name
    if image:
        f.type.imageType.width, f.type.imageType.height = shape[-1], shape[-2] if len(shape) > 1 else 1
        f.type.imageType.colorSpace = ft.ImageFeatureType.GRAYSCALE
    else:
        f.type.multiArrayType.shape.extend(shape)
        f.type.multiArrayType.dataType = ft.ArrayFeatureType.FLOAT32
    out = spec.description.output.add()
    out.name = "y"
    out.type.multiArrayType.shape.extend([1, 4])
    return spec


class _Model:
    out_dtype = np.float32

    def __init__(self, spec, units, refuse):
        self.spec, self.units = spec, units
        if units in refuse:         # coremltools: the proxy's constructor raised, predict would raise it
            self.__proxy__, self._framework_error = None, RuntimeError(f"Error compiling model for {units}")
        else:
            self.__proxy__, self._framework_error = object(), None

    def get_spec(self):
        return self.spec

    def predict(self, data):
        return {"y": (np.asarray(data["x"], np.float32) * 2).astype(self.out_dtype)}


def _coreml(spec, refuse=(), out_dtype=np.float32):
    loaded = []

    def mlmodel(path, compute_units):
        loaded.append(compute_units)
        model = _Model(spec, compute_units, refuse)
        model.out_dtype = out_dtype
        return model

    return types.SimpleNamespace(ComputeUnit=_ComputeUnit, models=types.SimpleNamespace(MLModel=mlmodel)), loaded


def _package(tmp_path):
    pkg = tmp_path / "static.mlpackage"
    pkg.mkdir()
    (pkg / "Manifest.json").write_text("{}")
    bucket = {"name": "static", "file": "static.mlpackage/Manifest.json", "package": "static.mlpackage",
              "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}],
              "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 4]}]}
    return pkg / "Manifest.json", bucket


def _backend(module):
    return CoremlBackend(module=module, probe=lambda hw: {"installed": True, "macos": True, "apple_silicon": True},
                         name="coreml-stub")


# 1. compute units: the option's units are the tier and the device ------------------------------

def test_compute_units_option_gives_the_device_the_tier_is_assessed_for():
    """``compute_units=CPU_ONLY`` reached the session (``coreml:cpu_only``) but never ``assess``: the
    choice said tier ``accelerator``, "Neural Engine, GPU or CPU". The backend now names the
    sub-device the options make, which assesses as the CPU."""
    backend = CoremlBackend()
    for sub, opts, want in ((None, {"compute_units": "CPU_ONLY"}, "cpu_only"), ("auto", {}, None),
                            (None, {"compute_units": "cpu_and_ne"}, "cpu_and_ne"), ("cpu_only", {}, "cpu_only")):
        assert backend.device_for(sub, opts) == want
    suit = backend.suitability("coreml", MAC, backend.device_for(None, {"compute_units": "CPU_ONLY"}))
    assert suit.tier == "cpu" and suit.device == "coreml:cpu_only" and "Neural Engine" not in suit.reason
    with pytest.raises(er.InputError, match="disagree"):
        backend.device_for("cpu_only", {"compute_units": "ALL"})
    # the device string alone (coreml, coreml:auto) is assessed as ALL: its reason says the option may differ
    assert "unless the compute_units option sets other units" in backend.suitability("coreml", MAC).reason


# 2. a package Core ML cannot load on the asked units ----------------------------------------------

def test_a_unit_core_ml_cannot_load_on_falls_back_to_the_cpu_and_says_so(tmp_path):
    """Core ML refused the package on the Neural Engine (its loader raised): load failed with
    ``device_unavailable`` although the CPU runs every op, and nothing fell back. Now the session runs
    CPU_ONLY, is named so, and says why (``fallback``): the runtime reports it, strict refuses it."""
    from edge_runtime.selection import Choice, session_fallback

    path, bucket = _package(tmp_path)
    module, loaded = _coreml(_spec(), refuse=("CPU_AND_NE", "ALL"))
    sess = _backend(module).load(path, bucket, "cpu_and_ne")
    try:
        assert loaded == ["CPU_AND_NE", "CPU_ONLY"]
        assert sess.device == "coreml-stub:cpu_only" and sess.compute_units == "CPU_ONLY"
        assert "with compute units CPU_AND_NE" in sess.fallback and "Error compiling model" in sess.fallback
        assert sess.info()["allowed_units"] == "CPU only"
        assert sess.run({"x": np.ones((1, 4), np.float32)})["y"].tolist() == [[2, 2, 2, 2]]
        choice = Choice({"target": "coreml"}, "coreml-stub", _backend(module).suitability("coreml", MAC,
                                                                                          "cpu_and_ne"))
        assert "CPU_ONLY" in session_fallback(choice, [sess])
        with pytest.raises(er.DeviceError) as ei:
            session_fallback(choice, [sess], strict=True)
        assert ei.value.code == "device_fell_back"
    finally:
        sess.close()


def test_a_package_core_ml_cannot_load_at_all_stays_device_unavailable(tmp_path):
    path, bucket = _package(tmp_path)
    for refuse in (("ALL", "CPU_ONLY"),):
        module, loaded = _coreml(_spec(), refuse=refuse)
        with pytest.raises(er.DeviceError) as ei:
            _backend(module).load(path, bucket)
        assert ei.value.code == "device_unavailable" and loaded == ["ALL", "CPU_ONLY"]
    # asked for the CPU and refused there: nothing else to try
    module, loaded = _coreml(_spec(), refuse=("CPU_ONLY",))
    with pytest.raises(er.DeviceError):
        _backend(module).load(path, bucket, "cpu_only")
    assert loaded == ["CPU_ONLY"]


# 3. an image-typed package input ------------------------------------------------------------------

def test_image_typed_package_input_is_refused_at_load(tmp_path):
    """A package converted with ``ct.ImageType`` takes an image (its own scale, bias and colour
    layout) where the task feeds a normalised float tensor: it loaded, and every answer would be
    the model's on a reinterpreted input. Now refused at load, typed (exit 3)."""
    path, bucket = _package(tmp_path)
    module, _ = _coreml(_spec(image=True))
    with pytest.raises(er.ArtifactError, match="'x' is a Core ML imageType, not a multi-array") as ei:
        _backend(module).load(path, bucket)
    assert ei.value.code == "input_contract_mismatch"
    for spec, why in ((_spec(name="input"), "are not the manifest's"), (_spec(shape=(4, 1)), "has shape [4, 1]")):
        module, _ = _coreml(spec)
        with pytest.raises(er.ArtifactError, match=why.replace("[", "\\[").replace("]", "\\]")) as ei:
            _backend(module).load(path, bucket)
        assert ei.value.code == "input_contract_mismatch"
    module, _ = _coreml(_spec())
    sess = _backend(module).load(path, bucket)     # the tensor the task feeds: loads and runs
    assert sess.run({"x": np.ones((1, 4), np.float32)})["y"].shape == (1, 4)
    sess.close()


def test_an_output_of_another_kind_than_the_manifests_is_not_cast_into_it(tmp_path):
    """The session cast every Core ML output to the manifest's dtype: floats where the manifest says
    int64 were truncated into plausible codes, and integer codes where it says float32 became "real
    values" the runtime's own output check (``output_contract_mismatch``) could no longer see."""
    path, bucket = _package(tmp_path)
    x = {"x": np.full((1, 4), 1.3, np.float32)}
    int_bucket = {**bucket, "outputs": [{"name": "y", "dtype": "int64", "shape": [1, 4]}]}
    for b, out_dtype, why in ((int_bucket, np.float32, "is float32 from Core ML, the manifest's is int64"),
                              (bucket, np.int32, "is int32 from Core ML, the manifest's is float32"),
                              (bucket, np.uint8, "is uint8 from Core ML")):
        module, _ = _coreml(_spec(), out_dtype=out_dtype)
        sess = _backend(module).load(path, b)
        with pytest.raises(ValueError, match=why):
            sess.run(x)
        sess.close()
    # what keeps every value still casts: float16 to float32, int32 to int64
    for b, out_dtype in ((bucket, np.float16), (int_bucket, np.int32)):
        module, _ = _coreml(_spec(), out_dtype=out_dtype)
        sess = _backend(module).load(path, b)
        y = sess.run(x)["y"]
        assert y.dtype == np.dtype(b["outputs"][0]["dtype"])
        sess.close()


# 4. OpenVINO AUTO: the device it switches to after load -------------------------------------------

class _AutoCompiled:
    """An AUTO compiled model: the CPU's, answering AUTO's EXECUTION_DEVICES and MULTI_DEVICE_PRIORITIES."""

    def __init__(self, real, executed, priorities, reads):
        self._real, self._executed, self._priorities, self.reads = real, list(executed), priorities, reads

    def get_property(self, name):
        self.reads.append(name)
        if name == "EXECUTION_DEVICES":
            return [self._executed.pop(0) if len(self._executed) > 1 else self._executed[0]]
        if name == "MULTI_DEVICE_PRIORITIES":
            return self._priorities
        if name == "DEVICE_PROPERTIES":
            return {"CPU": {k: self._real.get_property(k) for k in ("INFERENCE_PRECISION_HINT",
                                                                    "INFERENCE_NUM_THREADS")}}
        if name in ("INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS"):
            raise RuntimeError("AUTO has no such property of its own")
        return self._real.get_property(name)

    def __getattr__(self, name):
        return getattr(self._real, name)


class _AutoCore:
    def __init__(self, executed, priorities="GPU,CPU"):
        from edge_runtime.devices.openvino_core import core

        self.real, self.executed, self.priorities = core(), executed, priorities
        self.compiled_on, self.reads = [], []
        self.available_devices = ["CPU", "GPU"]

    def compile_model(self, model, device, config):
        self.compiled_on.append((device, config.get("PERFORMANCE_HINT")))
        real = self.real.compile_model(model, "CPU", config)
        if device != "AUTO":
            return real
        return _AutoCompiled(real, self.executed, self.priorities, self.reads)




def test_auto_on_its_cpu_helper_at_load_is_not_named_for_one_device(tiny_ir, monkeypatch):
    """AUTO runs on its CPU helper ("(CPU)") while the GPU compiles, then switches: the session read
    EXECUTION_DEVICES once and named "openvino:(cpu)" for ever, and every GPU result said so. Now it
    names every device AUTO may run on, info() reads where it runs now, and no call reads a property."""
    from edge_runtime.devices import openvino_backend
    from edge_runtime.devices.openvino_backend import OpenVinoBackend

    fake = _AutoCore(["(CPU)", "GPU.0"])
    monkeypatch.setattr(openvino_backend, "core", lambda: fake)
    path, bucket = tiny_ir
    sess = OpenVinoBackend().load(path, bucket, "auto", {"precision": "f32", "cache": False})
    try:
        assert sess.device == "openvino:auto:gpu,cpu"
        reads = len(fake.reads)
        for _ in range(5):
            assert sess.run({"x": np.array([[-1, 0, 1, 2]], np.float32)})["y"].tolist() == [[0, 0, 0.5, 1]]
        assert len(fake.reads) == reads             # no property read per call
        info = sess.info()
        assert info["execution_devices"] == ["(CPU)"] and info["execution_devices_now"] == ["GPU.0"]
        assert info["auto_candidates"] == ["GPU", "CPU"]
    finally:
        sess.close()


def test_auto_that_chose_the_cpu_runs_its_batch_model_on_the_cpu(tiny_ir, monkeypatch):
    """AUTO that chose the CPU is named ``openvino:cpu``; its batch (THROUGHPUT) model was compiled on
    AUTO again, which may choose otherwise or start on its CPU helper: it is compiled on the CPU now."""
    from edge_runtime.devices import openvino_backend
    from edge_runtime.devices.openvino_backend import OpenVinoBackend

    fake = _AutoCore(["CPU"])
    monkeypatch.setattr(openvino_backend, "core", lambda: fake)
    path, bucket = tiny_ir
    sess = OpenVinoBackend().load(path, bucket, "auto", {"precision": "f32", "cache": False, "jobs": 1})
    try:
        assert sess.device == "openvino:cpu"
        out = sess.run_many([{"x": np.array([[2, 2, 2, 2]], np.float32)}])
        assert out[0]["y"].tolist() == [[1, 1, 1, 1]]
        assert fake.compiled_on == [("AUTO", "LATENCY"), ("CPU", "THROUGHPUT")]
    finally:
        sess.close()


def test_auto_device_names():
    from edge_runtime.devices.openvino_core import auto_device

    assert auto_device(["CPU"], ["GPU", "CPU"]) == "cpu"
    assert auto_device(["(CPU)"], ["GPU", "CPU"]) == "auto:gpu,cpu"
    assert auto_device(["GPU.0"], ["GPU", "CPU"]) == "auto:gpu,cpu"     # a failed request retries on the CPU
    assert auto_device(["GPU.0"], []) == "auto:gpu.0"
    assert auto_device(["AUTO"], []) == "auto"


def test_auto_result_names_every_device_it_may_have_run_on(ov_digits_artifact, monkeypatch):
    """Through the runtime: the result's device is the session's (read once at load)."""
    pytest.importorskip("openvino")
    from edge_runtime.devices import openvino_backend

    fake = _AutoCore(["(CPU)", "GPU.0"])
    monkeypatch.setattr(openvino_backend, "core", lambda: fake)
    with er.load(ov_digits_artifact, device="openvino:auto", strict=True, device_options={"cache": False}) as rt:
        res = rt.infer(np.tile(np.arange(8, dtype=np.uint8) * 30, (8, 1)))
        assert res.device == rt.device == "openvino:auto:gpu,cpu" and rt.choice.fallback is None
        assert rt.info()["sessions"][0]["execution_devices_now"] == ["GPU.0"]
