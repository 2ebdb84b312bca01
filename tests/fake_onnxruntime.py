"""ONNX Runtime's GPU boundary, faked: a module object whose build "has" TensorRT/CUDA.

``get_available_providers()`` lists what the build would have;
``InferenceSession`` records the providers and provider options it was given,
keeps only those that "initialise" (``initialises``: ORT silently drops the
others, as it does for a provider whose libraries or GPU are missing) and runs
the model on the real CPU onnxruntime. Everything above this boundary (the
backend, provider order and options, the runtime, fallback reporting) is the
real code.
"""

import onnxruntime as real

TRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"


class FakeOrtModule:
    SessionOptions = real.SessionOptions
    GraphOptimizationLevel = real.GraphOptimizationLevel
    RunOptions = real.RunOptions

    def __init__(self, available=(TRT, CUDA, CPU), initialises=None):
        self.available = list(available)
        self.initialises = set(self.available if initialises is None else initialises) | {CPU}
        self.sessions = []

    def get_available_providers(self):
        return list(self.available)

    def InferenceSession(self, path, sess_options=None, providers=None, provider_options=None):  # noqa: N802
        sess = FakeInferenceSession(self, path, sess_options, providers, provider_options)
        self.sessions.append(sess)
        return sess


class FakeInferenceSession:
    def __init__(self, owner, path, sess_options, providers, provider_options):
        unknown = [p for p in providers if p not in owner.available]
        if unknown:
            raise ValueError(f"unknown providers {unknown}")
        self.path, self.providers_given = path, list(providers)
        self.provider_options = list(provider_options or [{} for _ in providers])
        self._used = [p for p in providers if p in owner.initialises]
        self._real = real.InferenceSession(path, sess_options=sess_options, providers=[CPU])

    def get_providers(self):
        return list(self._used)

    def get_inputs(self):
        return self._real.get_inputs()

    def run(self, *args):
        return self._real.run(*args)
