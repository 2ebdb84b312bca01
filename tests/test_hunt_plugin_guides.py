"""README's "How to add a backend" and "How to add a task", followed as an outside developer would
(hunt h31, 2026-12-07):

- two installed distributions that register one entry-point name with different objects are a
  clash, refused with each registry's typed broken-plug-in error naming both (before: the one
  scanned last was used, silently);
- an entry-point reference is read as ``importlib.metadata`` reads it (``mod:Cls [extra]`` loaded
  ``mod`` then failed on ``getattr(mod, "Cls [extra]")``);
- the guide's two examples, taken from README as they are, run: the backend loads and runs an
  artifact of its new target, the task takes what ``infer``, ``score`` and ``serve`` hand it, and
  passes the task contract suite (before: the task refused named tensors and JSON lists, and had
  no ``warmup_sample``, so the contract suite's checks stopped at its bucket samples).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, add_distribution

import edge_runtime as er
from edge_runtime import plugins
from edge_runtime.errors import InputError


def _site(path: Path, dist: str, entry_points: dict, modules: dict[str, str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, code in modules.items():
        (path / f"{name}.py").write_text(textwrap.dedent(code))
    add_distribution(path, dist, entry_points)
    return path


BACKEND = '''
from edge_runtime.devices.base import DeviceBackend, Suitability

class {cls}(DeviceBackend):
    name = "clashdev"
    targets = ("clashdev-t",)

    def assess(self, target, hardware, sub, forced, facts):
        return Suitability("cpu", f"clashdev:{{sub}}", "{cls} here")
'''

TASK = '''
from edge_runtime.models.base import Task

class {cls}(Task):
    name = "{name}"

    def prepare(self, raw, limits):      # the contract's methods: a Task without them is refused (h34)
        raise NotImplementedError("a registry test's task")

    def finish(self, outputs, prepared):
        raise NotImplementedError("a registry test's task")

    @staticmethod
    def compare(reference, candidate):
        raise NotImplementedError("a registry test's task")
'''


# -- name clashes ------------------------------------------------------------------------------
def test_two_plugins_registering_one_name_are_refused_naming_both(tmp_path, monkeypatch):
    from edge_runtime.models import TaskInvalid, get_task, refresh, task_names

    a = _site(tmp_path / "a", "h31-plugin-a", {"edge_runtime.devices": {"clashdev": "h31_clash_a:BackendA"},
                                               "edge_runtime.tasks": {"h31-clash": "h31_clash_a:TaskA",
                                                                      "h31-shared": "h31_shared:TaskS",
                                                                      "tensors": "h31_clash_a:Tensors2"}},
              {"h31_clash_a": BACKEND.format(cls="BackendA") + TASK.format(cls="TaskA", name="h31-clash")
               + TASK.format(cls="Tensors2", name="tensors"),
               "h31_shared": TASK.format(cls="TaskS", name="h31-shared")})
    b = _site(tmp_path / "b", "h31-plugin-b", {"edge_runtime.devices": {"clashdev": "h31_clash_b:BackendB"},
                                               "edge_runtime.tasks": {"h31-clash": "h31_clash_b:TaskB",
                                                                      "h31-shared": "h31_shared:TaskS"}},
              {"h31_clash_b": BACKEND.format(cls="BackendB") + TASK.format(cls="TaskB", name="h31-clash")})

    # the CLI, in a fresh process: `edge-infer devices` names the clash, runs neither backend
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(a), str(b), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "devices", "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads(proc.stdout)["backends"]["clashdev"]
    assert "suitability" not in entry, entry                 # before: BackendB (last on sys.path), silently
    for part in ("h31-plugin-a", "h31_clash_a:BackendA", "h31-plugin-b", "h31_clash_b:BackendB"):
        assert part in entry["error"], entry

    # the task registry, in this process
    monkeypatch.syspath_prepend(str(b))
    monkeypatch.syspath_prepend(str(a))
    refresh()
    try:
        assert "h31-clash" in task_names()
        with pytest.raises(TaskInvalid) as ei:
            get_task("h31-clash")
        assert ei.value.code == "task_invalid"
        assert all(p in ei.value.message for p in ("h31-plugin-a", "h31_clash_a:TaskA", "h31-plugin-b",
                                                   "h31_clash_b:TaskB")), ei.value.message
        assert get_task("h31-shared").__name__ == "TaskS"          # the same object twice is no clash
        assert get_task("tensors").__name__ == "Tensors2"          # a plug-in still replaces a built-in
        refs = plugins.entry_point_refs("edge_runtime.devices")
        assert isinstance(refs["clashdev"], plugins.ClashRef) and refs["onnxruntime"].startswith("edge_runtime.")
        with pytest.raises(plugins.PluginClash):
            plugins.resolve_ref(refs["clashdev"])
    finally:
        for mod in ("h31_clash_a", "h31_clash_b", "h31_shared"):
            sys.modules.pop(mod, None)
        monkeypatch.undo()
        refresh()


# -- entry-point references as importlib.metadata reads them -----------------------------------
def test_a_reference_with_extras_or_spaces_loads_as_importlib_metadata_loads_it(tmp_path, monkeypatch):
    from importlib.metadata import EntryPoint

    from edge_runtime.models import get_task, refresh

    for ref in ("json.decoder:JSONDecoder [speedups]", "json.decoder : JSONDecoder", "json.decoder:JSONDecoder"):
        assert plugins.resolve_ref(ref) is EntryPoint("x", ref, "g").load()
    assert plugins.resolve_ref("json") is sys.modules["json"]
    with pytest.raises(ValueError):
        plugins.resolve_ref("not a reference!")

    site = _site(tmp_path / "site", "h31-extras", {"edge_runtime.tasks": {"h31-extras": "h31_extras:Extras [gpu]"}},
                 {"h31_extras": TASK.format(cls="Extras", name="h31-extras")})
    monkeypatch.syspath_prepend(str(site))
    refresh()
    try:
        assert get_task("h31-extras").__name__ == "Extras"        # before: TaskInvalid (AttributeError)
    finally:
        sys.modules.pop("h31_extras", None)
        monkeypatch.undo()
        refresh()


# -- the guide's examples, as README prints them -----------------------------------------------
def _readme_blocks() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    guides = text[text.index("## How to add a backend"):text.index("## Measured on the target")]
    return {b.splitlines()[0].lstrip("# ").strip(): b for b in re.findall(r"```python\n(.*?)```", guides, re.S)}


VENDOR = '''
"""A pretend vendor SDK for the guide's backend: a model is an .npz, one weight matrix per output."""
import numpy as np

class Model:
    def __init__(self, path, threads):
        with np.load(path, allow_pickle=False) as data:
            self.w = {k: data[k] for k in data.files}
        self.aborted = False

    def abort(self):
        self.aborted = True

    def run(self, feeds):
        x = np.concatenate([np.asarray(v, np.float32).ravel() for _, v in sorted(feeds.items())])
        return [(x @ self.w[k]).reshape(1, -1).astype(np.float32) for k in sorted(self.w)]

def load(path, threads=1):
    return Model(path, threads)
'''


def _anomaly_artifact(root: Path, target: str, write_model) -> Path:
    from edge_runtime.artifact import ArtifactWriter
    from edge_runtime.manifest import FORMAT, FORMAT_VERSION

    w = ArtifactWriter(root)
    (root / target).mkdir(parents=True)
    bucket = {"name": "static", "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}],
              "outputs": [{"name": "score", "dtype": "float32", "shape": [1, 1]}]}
    write_model(root / target / "static.npz", bucket, seed=0)
    w.add_file(f"{target}/static.npz")
    variant = {"target": target, "buckets": [{**bucket, "file": f"{target}/static.npz"}],
               "quantization": {"scheme": "none", "weights": "float32", "activations": "float32",
                                "calibration": {"samples": 0, "fingerprint": ""}},
               "parity": {"metric": "none", "value": None, "samples": 0}, "toolchain": {"h31": "0"}}
    w.write_manifest({"format": FORMAT, "format_version": FORMAT_VERSION, "model": {"name": "anom", "version": "1"},
                      "task": "anomaly-score", "files": {}, "preprocess": {"kind": "tensors"},
                      "postprocess": {"output": "score", "threshold": 0.5}, "limits": {}, "variants": [variant]})
    return root


def test_the_guides_examples_run_through_infer_score_serve_forms_and_the_contract_suite(tmp_path, monkeypatch):
    import test_task_contract as contract
    from fake_backend import write_fake_model

    from edge_runtime.devices import registry
    from edge_runtime.models import get_task, refresh

    blocks = _readme_blocks()
    assert set(blocks) == {"mybackend.py", "mytask.py"}, list(blocks)
    site = _site(tmp_path / "site", "h31-guide", {"edge_runtime.tasks": {"anomaly-score": "h31_guide_task:Anomaly"}},
                 {"h31_guide_backend": blocks["mybackend.py"], "h31_guide_task": blocks["mytask.py"],
                  "h31_guide_sdk": VENDOR, "mydev_sdk": VENDOR})
    monkeypatch.syspath_prepend(str(site))
    refresh()
    import h31_guide_backend
    import h31_guide_sdk

    def weights(path, bucket, seed=0):
        rng = np.random.default_rng(seed)
        n = sum(int(np.prod(t["shape"])) for t in bucket["inputs"])
        np.savez(path, **{t["name"]: rng.standard_normal((n, int(np.prod(t["shape"])))).astype(np.float32)
                          for t in bucket["outputs"]})

    # tests inject the vendor module (README: `module=`); the rest is the guide's code as printed
    registry.register("mydev", lambda: h31_guide_backend.MyBackend(module=h31_guide_sdk))
    try:
        cls = get_task("anomaly-score")
        art = _anomaly_artifact(tmp_path / "art", "mydev-int8", weights)
        x = np.array([1, -2, 3, 0.5], np.float32)
        with er.load(art, device="mydev", strict=True) as rt:
            want = rt.infer(x)                                      # `infer --input x.npy`
            assert want.device == "mydev:npu" and isinstance(want.prediction, bool)
            for raw in ({"x": x}, {"x": x[None]}, x.tolist()):     # .npz and serve items; a score record's array
                got = rt.infer(raw)
                assert got.prediction == want.prediction and got.scores == want.scores, raw
            for bad in ("text", [1, 2], [[1, 2], [3]], {"y": x}, np.array([np.nan, 0, 0, 0]),
                        np.array(["a", "b", "c", "d"]), [1e300, 0, 0, 0]):
                with pytest.raises(InputError):
                    rt.infer(bad)
        # the task contract suite's checks over an artifact (the fake backend's target)
        contract.check_task(cls, _anomaly_artifact(tmp_path / "fake-art", "fake", write_fake_model),
                            tmp_path / "contract")
    finally:
        registry.unregister("mydev")
        for mod in ("h31_guide_backend", "h31_guide_task", "h31_guide_sdk"):
            sys.modules.pop(mod, None)
        monkeypatch.undo()
        refresh()
