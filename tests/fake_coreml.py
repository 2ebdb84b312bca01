"""The Core ML vendor boundary, faked: a ``coremltools``-shaped module whose
``models.MLModel`` reads the package's real spec (coremltools,
``skip_model_load=True``) and whose ``predict`` runs a CPU twin (the bucket's
fp32 ONNX on onnxruntime) after checking the feeds against the spec's own
input names, shapes and dtypes.

Everything above this boundary (compute units, package checks, int32 casting,
output mapping, sessions, the runtime) is the real ``devices/coreml_backend.py``
code; only Core ML's execution is replaced, so numbers are the twin's, not
Core ML's.
"""

import enum
import types
from pathlib import Path

import numpy as np

_DTYPES = {"FLOAT32": np.float32, "FLOAT16": np.float16, "INT32": np.int32}


class ComputeUnit(enum.Enum):
    ALL = 1
    CPU_AND_NE = 2
    CPU_ONLY = 3
    CPU_AND_GPU = 4


class FakeMLModel:
    def __init__(self, path, compute_units, twin):
        import coremltools as ct
        import onnxruntime as ort
        from coremltools.proto import FeatureTypes_pb2 as ft

        self.path, self.compute_units = str(path), compute_units
        self.spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
        name = ft.ArrayFeatureType.ArrayDataType.Name
        self.inputs = {f.name: (list(f.type.multiArrayType.shape), _DTYPES[name(f.type.multiArrayType.dataType)])
                       for f in self.spec.description.input}
        self.outputs = [f.name for f in self.spec.description.output]
        # features renamed for Core ML (identifiers only) map back to the twin's ONNX names
        import json

        renamed = json.loads(self.spec.description.metadata.userDefined.get("edge_runtime.tensor_names", "{}"))
        self._onnx = {v: k for k, v in renamed.items()}
        self._twin = ort.InferenceSession(str(twin), providers=["CPUExecutionProvider"])
        self._twin_dtypes = {i.name: np.float32 if "float" in i.type else np.int64 for i in self._twin.get_inputs()}
        self.calls = 0

    def get_spec(self):
        return self.spec

    def predict(self, data):
        if set(data) != set(self.inputs):
            raise ValueError(f"Core ML (fake): inputs {sorted(data)} != model inputs {sorted(self.inputs)}")
        for k, (shape, dtype) in self.inputs.items():
            if list(data[k].shape) != shape or data[k].dtype != dtype:
                raise ValueError(f"Core ML (fake): {k} is {data[k].dtype}{list(data[k].shape)}, "
                                 f"the model wants {np.dtype(dtype)}{shape}")
        self.calls += 1
        feeds = {self._onnx.get(k, k): v for k, v in data.items()}
        out = self._twin.run([self._onnx.get(o, o) for o in self.outputs],
                             {k: v.astype(self._twin_dtypes[k]) for k, v in feeds.items()})
        return dict(zip(self.outputs, out))


class FakeCoremltools:
    """``coremltools`` as the backend uses it: ``models.MLModel`` and ``ComputeUnit``."""

    ComputeUnit = ComputeUnit

    def __init__(self, twins: dict):
        self.twins = {str(Path(k).resolve()): v for k, v in twins.items()}   # package dir -> fp32 ONNX
        self.loaded = []
        self.models = types.SimpleNamespace(MLModel=self._load)

    def _load(self, path, compute_units=ComputeUnit.ALL):
        model = FakeMLModel(path, compute_units, self.twins[str(Path(path).resolve())])
        self.loaded.append(model)
        return model
