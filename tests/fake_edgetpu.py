"""The Edge TPU's vendor boundary, faked: ``load_delegate`` and an Interpreter
that, given the fake delegate, runs the compiled model's CPU twin.

Everything above this boundary (detecting compiled models, picking the
delegate library and device, typed errors, sessions, the runtime) is the real
code; only libedgetpu and the TPU itself are replaced.
"""

from ai_edge_litert import interpreter as real


class FakeDelegate:
    def __init__(self, library, options):
        self.library, self.options = library, dict(options or {})


class FakeEdgeTpuModule:
    def __init__(self, twins: dict, libraries=("libedgetpu.so.1", "libedgetpu.1.dylib", "edgetpu.dll")):
        self.twins = {str(k): str(v) for k, v in twins.items()}   # compiled model path -> CPU twin
        self.libraries = set(libraries)
        self.loaded = []

    def load_delegate(self, library, options=None):
        if library not in self.libraries:
            raise ValueError(f"Failed to load delegate from {library}")
        d = FakeDelegate(library, options)
        self.loaded.append(d)
        return d

    def Interpreter(self, model_path, experimental_delegates=None, num_threads=None):  # noqa: N802 (vendor API)
        if experimental_delegates and any(isinstance(d, FakeDelegate) for d in experimental_delegates):
            return real.Interpreter(model_path=self.twins[str(model_path)], num_threads=1)
        return real.Interpreter(model_path=model_path, num_threads=num_threads)
