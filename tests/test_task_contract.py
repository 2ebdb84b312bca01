"""The task seam (issue #16): every registered task passes one contract suite.

A task declares its manifest sections, sample loader, parity metric, the inputs it
takes and what convert needs (``models/base.py: Task``); the registry
(``edge_runtime.models``: built-ins + the ``edge_runtime.tasks`` entry points),
manifest validation, the CLI and the converters derive from those declarations.

The checks (``check_*`` below) run over every built-in task on a small fake-backend
artifact (tests/factories.py), and over a toy task written as ONE file outside the
package and registered through the entry point of a temporary distribution (a
``.dist-info`` with ``entry_points.txt`` on ``sys.path``): with no other file of the
project touched it passes the same checks, validates, loads and runs with
``edge_runtime.load`` on the fake backend, and the CLI takes it as ``--task``.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime.artifact import ArtifactWriter
from edge_runtime.errors import ArtifactError, InputError
from edge_runtime.limits import DEFAULT_LIMITS
from edge_runtime.models.base import Prepared, Task, TaskOutput

BUILTINS = ("text-classification", "text-embedding", "image-classification", "tensors", "object-detection",
            "pose-estimation", "semantic-segmentation")
INPUT_KINDS = ("text", "image", "tensors")
SECTIONS = ("preprocess", "postprocess")
BAD_INPUTS = (object(), None, 3.5)          # no task takes these: each is an InputError from prepare()


# -- the checks every task passes ------------------------------------------------------

def _overrides(cls, member: str) -> bool:
    return getattr(cls, member) is not getattr(Task, member) and \
        getattr(getattr(cls, member), "__func__", None) is not getattr(getattr(Task, member), "__func__", 0)


def check_declarations(cls) -> None:
    """The declarations are present, typed and consistent with each other."""
    from edge_runtime.models import get_task

    assert isinstance(cls, type) and issubclass(cls, Task)
    assert isinstance(cls.name, str) and cls.name and get_task(cls.name) is cls
    assert isinstance(cls.parity_metric, str) and cls.parity_metric
    assert isinstance(cls.parity_best, (int, float))
    assert isinstance(cls.input_kind, str) and cls.input_kind
    assert isinstance(cls.score_field, str) and cls.score_field
    assert isinstance(cls.length_unit, str) and cls.length_unit
    assert cls.recipe_family in ("cnn", "transformer"), cls.recipe_family   # the recipes the converters know
    for flag in ("sequence_buckets", "needs_tokenizer", "needs_preprocess", "takes_labels", "importable"):
        assert isinstance(getattr(cls, flag), bool), flag
    buckets = tuple(cls.default_buckets)
    if cls.sequence_buckets:
        assert buckets and all(isinstance(b, int) and b > 0 for b in buckets), buckets
    else:
        assert buckets == (), "default_buckets without sequence_buckets"
    keys = tuple(cls.preprocess_keys)
    assert all(isinstance(k, str) and k for k in keys) and len(set(keys)) == len(keys)
    assert not cls.needs_preprocess or keys, "needs --preprocess but reads no key of it"
    assert isinstance(cls.manifest_sections, dict) and set(cls.manifest_sections) <= set(SECTIONS)
    for section, fields in cls.manifest_sections.items():
        assert isinstance(fields, dict) and all(isinstance(k, str) and isinstance(t, (type, tuple))
                                                for k, t in fields.items()), section
    assert all(isinstance(k, str) for k in cls.manifest_files)
    # what the pipeline and the runtime call is there (the base has a default for everything else)
    assert _overrides(cls, "prepare") and _overrides(cls, "finish") and _overrides(cls, "compare")
    assert _overrides(cls, "load_samples"), "a task converts from samples: it declares load_samples"
    assert cls.importable == _overrides(cls, "import_sections"), "importable iff import_sections is its own"
    assert cls.importable or tuple(cls.import_options) == ()


def check_preprocess_contract(cls) -> None:
    """--preprocess: nothing given is fine, an unknown key or a non-object is the caller's."""
    cls.check_preprocess(None)
    for bad in ({"__no_such_key__": 1}, "size=8x8", [1, 2]):
        with pytest.raises(InputError) as ei:
            cls.check_preprocess(bad)
        assert ei.value.code == "convert_preprocess_invalid"
    with pytest.raises(InputError) as ei:
        cls.check_preprocess({"__no_such_key__": 1})
    assert cls.name in ei.value.message and "__no_such_key__" in ei.value.message


def _random_outputs(bucket: dict, seed: int = 0) -> dict:
    """Outputs any model of the task could give: floats in 0..1 (probabilities, normalised coordinates and
    logits alike; a task may refuse what its kind of model never answers, as pose refuses scores past 0..1)."""
    rng = np.random.default_rng(seed)
    outs = {}
    for spec in bucket["outputs"]:
        dtype = np.dtype(spec["dtype"])
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            outs[spec["name"]] = rng.integers(max(info.min, -100), min(info.max, 100), spec["shape"]).astype(dtype)
        else:
            outs[spec["name"]] = rng.random(spec["shape"]).astype(dtype)
    return outs


def check_instance(task, limits=DEFAULT_LIMITS) -> list:
    """prepare() of the task's own samples gives feeds that match the bucket specs (and route to
    the bucket each was made for); finish() gives a TaskOutput; compare() of identical outputs
    gives the metric at its best value. Returns the bucket samples."""
    cls = type(task)
    samples = task.bucket_samples(limits)
    assert len(samples) == len(task.buckets) and any(s is not None for s in samples)
    if cls.sequence_buckets and len(task.buckets) > 1:
        assert all(s is not None for s in samples), "a sequence task has a sample for each bucket"
    warm = task.warmup_sample()
    for idx, raw in [(i, s) for i, s in enumerate(samples) if s is not None] + [(None, warm)]:
        if raw is None:
            continue
        prep = task.prepare(raw, limits)
        assert isinstance(prep, Prepared) and 0 <= prep.bucket < len(task.buckets)
        if idx is not None:
            assert prep.bucket == idx, f"sample for bucket {idx} went to {prep.bucket}"
        specs = {t["name"]: t for t in task.buckets[prep.bucket]["inputs"]}
        assert set(prep.feeds) == set(specs)
        for name, arr in prep.feeds.items():
            assert isinstance(arr, np.ndarray), name
            assert list(arr.shape) == list(specs[name]["shape"]), (name, arr.shape, specs[name]["shape"])
            assert arr.dtype == np.dtype(specs[name]["dtype"]), (name, arr.dtype)
        out = task.finish(_random_outputs(task.buckets[prep.bucket], seed=prep.bucket), prep)
        assert isinstance(out, TaskOutput)
        same = cls.compare([out], [out])
        assert same["metric"] == cls.parity_metric and same["samples"] == 1
        assert same["value"] == pytest.approx(cls.parity_best, abs=1e-6)
    for bad in BAD_INPUTS:
        with pytest.raises(InputError):
            task.prepare(bad, limits)
    return samples


def check_runtime(root: Path, cls) -> list:
    """The artifact validates, loads and runs on the fake backend; bad input is an InputError before
    any device work (the backend here fails every run); the length histogram has the task's unit."""
    with er.load(root, device="fake", device_options={"fail_after": 0}, warmup=False) as rt:
        assert type(rt.task) is cls
        for bad in BAD_INPUTS:
            with pytest.raises(InputError):
                rt.infer(bad)
        good = next(s for s in rt.task.bucket_samples(rt.limits) if s is not None)
        with pytest.raises(er.InferenceRuntimeError):     # a good input does reach the device
            rt.infer(good)
    results = []
    with er.load(root, device="fake") as rt:
        samples = check_instance(rt.task, rt.limits)
        for raw in samples:
            if raw is not None:
                res = rt.infer(raw)
                results.append(res.to_dict())
        assert rt.metrics()["input_length"]["unit"] == cls.length_unit
    return results


def _man(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def _rebuild(root: Path, dst: Path, pre_post) -> Path:
    """``root``'s artifact at ``dst`` with the sections ``pre_post(writer)`` builds (files through the
    writer), its variants' files copied: written through manifest validation."""
    from edge_runtime.manifest import SEAL

    man = _man(root)
    w = ArtifactWriter(dst)
    pre, post = pre_post(w)
    for v in man["variants"]:
        for b in v["buckets"]:
            for rel in [b["file"], *b.get("extra_files", [])]:
                w.add_file(rel, root / rel)
    body = {k: v for k, v in man.items() if k not in (SEAL, "files")}
    w.write_manifest({**body, "preprocess": pre, "postprocess": post})
    return dst


def example_request(cls, root: Path):
    """A ConvertRequest for ``cls`` that holds what ``root``'s artifact was made from."""
    from edge_runtime.converters.request import ConvertRequest

    man = _man(root)
    pre = {k: v for k, v in man["preprocess"].items() if k in cls.preprocess_keys} or None
    tok = man["preprocess"].get("tokenizer")
    labels = man["postprocess"].get("labels") if cls.takes_labels else None
    buckets = None
    if cls.sequence_buckets:
        buckets = sorted({b["inputs"][0]["shape"][-1] for b in man["variants"][0]["buckets"]})
    return ConvertRequest(source=root / "source.onnx", out=root.parent / "out", task=cls.name, targets=["fake"],
                          calibration=root / "calibration", preprocess=pre, buckets=buckets,
                          tokenizer=root / tok if tok else None, labels=root / labels if labels else None)


def check_sections(cls, root: Path, tmp: Path) -> None:
    """build_sections (what convert writes) round-trips through manifest validation and runs like
    the original; each key the task declares it needs is refused when missing; import sections too."""
    from edge_runtime import manifest as mf
    from edge_runtime.converters.pipeline import _sections
    from edge_runtime.converters.request import check_options

    req = example_request(cls, root)
    check_options(req)                    # --buckets only where the task has sequence buckets
    cls.check_preprocess(req.preprocess)
    first = _man(root)["variants"][0]["buckets"][0]
    facts = cls.check_io(first["inputs"], first["outputs"], _man(root)["postprocess"])
    assert isinstance(facts, dict)
    rebuilt = _rebuild(root, tmp / f"{cls.name}-built", lambda w: _sections(cls, req, w, first["outputs"]))
    man = _man(rebuilt)
    assert all(isinstance(man[s], dict) for s in SECTIONS)
    for section, fields in cls.manifest_sections.items():
        for key in fields:
            assert key in man[section], f"build_sections left out {section}.{key}, which the task needs at load"
            broken = json.loads(json.dumps(man))
            del broken[section][key]
            with pytest.raises(ArtifactError) as ei:
                mf.validate(broken)
            assert ei.value.code == "manifest_field_missing" and key in ei.value.message
    assert _same(check_runtime(rebuilt, cls)) == _same(check_runtime(root, cls))
    if cls.importable:
        model = {"inputs": first["inputs"], "outputs": first["outputs"], "ops": []}
        warnings: list = []
        imported = _rebuild(root, tmp / f"{cls.name}-imported",
                            lambda w: cls.import_sections(model, {}, warnings))
        check_runtime(imported, cls)


def _same(results: list[dict]) -> list[dict]:
    """What two artifacts with the same model and the same pre-processing answer alike (the
    post-processing's options, top_k say, may differ from the factory's)."""
    keep = ("prediction", "class_id", "embedding", "outputs", "bucket", "truncated")
    return [{k: r.get(k) for k in keep} for r in results]


def check_task(cls, root: Path, tmp: Path) -> None:
    check_declarations(cls)
    check_preprocess_contract(cls)
    check_sections(cls, root, tmp)


# -- the built-in tasks ----------------------------------------------------------------

def test_the_registry_lists_the_built_ins_and_names_them_in_its_errors():
    from edge_runtime.models import TaskInvalid, UnknownTask, _BUILTIN, get_task, task_names

    assert set(BUILTINS) <= set(task_names()) and set(_BUILTIN) == set(BUILTINS)
    for name in BUILTINS:
        assert get_task(name).name == name
    with pytest.raises(UnknownTask) as ei:
        get_task("telepathy")
    err = ei.value
    assert isinstance(err, InputError) and isinstance(err, KeyError) and err.code == "task_unknown"
    assert "'telepathy'" in err.message and all(n in err.message for n in BUILTINS)
    assert issubclass(TaskInvalid, er.EdgeRuntimeError) and not issubclass(TaskInvalid, InputError)


def _registered() -> list[str]:
    from edge_runtime.models import task_names

    return task_names()


@pytest.mark.parametrize("task", _registered())
def test_every_registered_task_declares_the_contract(task):
    """Whatever is installed (a plug-in's task too): the declarations, and --preprocess refusals."""
    from edge_runtime.models import get_task

    check_declarations(get_task(task))
    check_preprocess_contract(get_task(task))


@pytest.mark.parametrize("task", BUILTINS)
def test_every_built_in_task_passes_the_contract(task, make_artifact, tmp_path):
    from edge_runtime.models import get_task

    check_task(get_task(task), make_artifact(task), tmp_path)


def test_nothing_outside_models_lists_task_names():
    """The files that derive from the task declarations name no task and test no task-name prefix."""
    from conftest import ROOT

    derived = ["edge_runtime/manifest.py", "edge_runtime/metrics.py", "edge_runtime/cli_convert.py",
               "converters/request.py", "converters/pipeline.py", "converters/convert_inputs.py",
               "converters/build_variant.py", "converters/onnx_int8.py", "converters/openvino_int8.py",
               "converters/openvino_quant.py"]
    for rel in derived:
        text = (ROOT / rel).read_text()
        assert 'startswith("text-")' not in text and "TEXT_TASKS" not in text, rel
        for name in BUILTINS:
            assert f'"{name}"' not in text, f"{rel} names the task {name!r}"


def test_convert_requirements_derive_from_the_declarations(tmp_path):
    from edge_runtime.converters.request import PREPROCESS_KEYS, ConvertRequest, check_request
    from edge_runtime.models import get_task

    for name in BUILTINS:     # the old lookup table is a view of the declarations
        assert PREPROCESS_KEYS[name] == tuple(get_task(name).preprocess_keys)
    src = tmp_path / "m.onnx"
    src.write_bytes(b"not used")
    (tmp_path / "c.txt").write_text("a\nb\n")

    def refused(code, **kw):
        req = ConvertRequest(**{"source": src, "out": tmp_path / "o", "targets": ["onnx-int8"],
                                "calibration": tmp_path / "c.txt", **kw})
        with pytest.raises(InputError) as ei:
            check_request(req)
        assert ei.value.code == code, ei.value.message
        return ei.value.message

    assert "--tokenizer" in refused("convert_tokenizer_missing", task="text-embedding")
    assert "'nope'" in refused("convert_task_unknown", task="nope")
    assert "--labels" in refused("convert_labels_unused", task="text-embedding", tokenizer=src, labels=src)
    assert "text tasks" in refused("convert_buckets_invalid", task="tensors", buckets=[8],
                                   calibration=_npz(tmp_path))
    assert "size" in refused("convert_preprocess_missing", task="image-classification", calibration=tmp_path)


def _npz(tmp_path: Path) -> Path:
    p = tmp_path / "c.npz"
    np.savez(p, x=np.zeros((4, 1, 4), np.float32))
    return p


def test_default_recipes_follow_the_recipe_family():
    from edge_runtime.converters.onnx_int8 import OnnxInt8Converter
    from edge_runtime.converters.openvino_int8 import OpenVinoConverter
    from edge_runtime.models import get_task

    for name in BUILTINS:
        family = get_task(name).recipe_family
        assert OnnxInt8Converter().default_recipe(name) == family == OpenVinoConverter().default_recipe(name)
    assert get_task("text-embedding").recipe_family == "transformer" and get_task("tensors").recipe_family == "cnn"


# -- a task is one file and one entry point ----------------------------------------------

TOY = '''
"""toy-chars: a text's character codes in sequence buckets -> class scores (a plug-in task)."""

from pathlib import Path

import numpy as np

from edge_runtime.errors import ArtifactError, InputError
from edge_runtime.models.base import Prepared, Task, TaskOutput, rank_classes, reject_type, softmax


class ToyChars(Task):
    name = "toy-chars"
    parity_metric = "top1_agreement"
    input_kind = "text"
    score_field = "text"
    length_unit = "characters"
    sequence_buckets = True
    default_buckets = (4, 8)
    manifest_sections = {"preprocess": {"max_length": int}, "postprocess": {"output": str}}

    @staticmethod
    def load_samples(path):
        return [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]

    @classmethod
    def check_sample_path(cls, path, what):
        if Path(path).is_dir():
            raise InputError(f"{what} {path} is a directory; toy-chars takes a .txt file",
                             code="convert_calibration_invalid")

    @classmethod
    def build_sections(cls, request, writer, outputs):
        return {"kind": "text", "max_length": max(request.buckets)}, {"output": outputs[0]["name"]}

    @staticmethod
    def compare(reference, candidate):
        agree = [r.class_id == c.class_id for r, c in zip(reference, candidate)]
        return {"metric": "top1_agreement", "value": float(np.mean(agree)) if agree else None,
                "samples": len(agree)}

    def __init__(self, manifest, read_file, buckets):
        super().__init__(manifest, read_file, buckets)
        self.lengths = []
        for b in buckets:
            if len(b["inputs"]) != 1 or len(b["inputs"][0]["shape"]) != 2:
                raise ArtifactError("toy-chars takes one [1, length] input", file="manifest.json",
                                    code="manifest_field_invalid")
            self.lengths.append(b["inputs"][0]["shape"][1])
        self.order = sorted(range(len(self.lengths)), key=self.lengths.__getitem__)
        self.output = self.post["output"]

    def prepare(self, raw, limits):
        if not isinstance(raw, str):
            reject_type(raw, "a text string")
        if not raw:
            raise InputError("text is empty", code="input_empty")
        if len(raw) > limits.max_text_chars:
            raise InputError("text is too long", code="input_too_long", limit=limits.max_text_chars)
        idx = next((i for i in self.order if self.lengths[i] >= len(raw)), self.order[-1])
        spec = self.buckets[idx]["inputs"][0]
        n = min(len(raw), self.lengths[idx])
        codes = np.zeros(spec["shape"], dtype=spec["dtype"])
        codes[0, :n] = [min(ord(c), 127) for c in raw[:n]]
        return Prepared(bucket=idx, feeds={spec["name"]: codes}, truncated=len(raw) > n, length=len(raw))

    def finish(self, outputs, prepared):
        logits = np.asarray(outputs[self.output], dtype=np.float32).reshape(-1)
        labels = [str(i) for i in range(logits.size)]
        label, class_id, scores, top = rank_classes(softmax(logits), labels, None)
        return TaskOutput(prediction=label, scores=scores, class_id=class_id, top_k=top)

    def warmup_sample(self):
        return "warm"

    def bucket_samples(self, limits):
        return ["a" * n for n in self.lengths]
'''


@pytest.fixture
def toy_task(tmp_path, monkeypatch):
    """The toy task as one module file plus a temporary distribution whose entry_points.txt
    registers it in the ``edge_runtime.tasks`` group; nothing else is touched."""
    from edge_runtime.models import get_task, task_names

    mod = f"toy_task_{abs(hash(str(tmp_path))) % 10**8}"
    site = tmp_path / "site"
    info = site / "toy_tasks-1.0.dist-info"
    info.mkdir(parents=True)
    (site / f"{mod}.py").write_text(textwrap.dedent(TOY))
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-tasks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[edge_runtime.tasks]\ntoy-chars = {mod}:ToyChars\n"
                                           f"toy-broken = {mod}:NoSuchClass\ntoy-misnamed = {mod}:Misnamed\n")
    assert "toy-chars" not in task_names()
    monkeypatch.syspath_prepend(str(site))
    yield get_task("toy-chars")
    sys.modules.pop(mod, None)


def _toy_artifact(root: Path, lengths=(4, 8), classes: int = 3) -> Path:
    """A fake-backend artifact of the toy task, written the way a plug-in's own tooling would."""
    from fake_backend import write_fake_model

    from edge_runtime.manifest import FORMAT, FORMAT_VERSION

    w = ArtifactWriter(root)
    buckets = []
    for i, n in enumerate(lengths):
        b = {"name": f"seq{n}", "file": f"fake/seq{n}.npz",
             "inputs": [{"name": "codes", "dtype": "int64", "shape": [1, n]}],
             "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, classes]}]}
        (root / "fake").mkdir(parents=True, exist_ok=True)
        write_fake_model(root / b["file"], b, seed=i)
        w.add_file(b["file"])
        buckets.append(b)
    w.write_manifest({
        "format": FORMAT, "format_version": FORMAT_VERSION, "model": {"name": "toy", "version": "1"},
        "task": "toy-chars", "files": {}, "preprocess": {"kind": "text", "max_length": max(lengths)},
        "postprocess": {"output": "logits"}, "limits": {},
        "variants": [{"target": "fake", "buckets": buckets,
                      "quantization": {"scheme": "none", "weights": "float32", "activations": "float32"},
                      "parity": {"metric": "none", "value": None, "samples": 0},
                      "toolchain": {"toy": "1"}}]})
    return root


def test_a_one_file_task_from_an_entry_point_passes_the_contract_and_runs(toy_task, tmp_path):
    from edge_runtime.models import task_names

    assert toy_task.__name__ == "ToyChars" and "toy-chars" in task_names()
    root = _toy_artifact(tmp_path / "toy")
    check_task(toy_task, root, tmp_path)
    with er.load(root, device="fake") as rt:
        short, long_ = rt.infer("abc"), rt.infer("abcdefg")
        assert (short.bucket, long_.bucket) == ("seq4", "seq8") and short.prediction in ("0", "1", "2")
        cut = rt.infer("x" * 20)
        assert cut.truncated and cut.bucket == "seq8"
    samples = tmp_path / "calib.txt"
    samples.write_text("one\ntwo\n\nthree\n")
    assert toy_task.load_samples(samples) == ["one", "two", "three"]
    with pytest.raises(InputError) as ei:
        toy_task.check_sample_path(tmp_path, "--calibration")
    assert ei.value.code == "convert_calibration_invalid"


def test_the_toy_task_is_known_to_manifest_validation_and_the_cli(toy_task, tmp_path):
    """The plug-in's name is a valid manifest task and a valid --task while its distribution is on
    sys.path, and an unknown one when it is not (the registry is read again when sys.path changes)."""
    from click.testing import CliRunner

    from edge_runtime import manifest as mf
    from edge_runtime.cli import main

    root = _toy_artifact(tmp_path / "toy")
    data = mf.parse((root / "manifest.json").read_bytes())
    assert data["task"] == "toy-chars" and "toy-chars" in mf.task_names()
    (tmp_path / "c.txt").write_text("abc\n")
    res = CliRunner().invoke(main, ["convert", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "o"),
                                    "--task", "toy-chars", "--calibration", str(tmp_path / "c.txt")])
    assert res.exit_code == 2 and "error [convert_source_missing]" in res.output, res.output   # past click's check
    res = CliRunner().invoke(main, ["convert", "--help"])
    assert "toy-chars" in res.output
    res = CliRunner().invoke(main, ["import", "m.tflite", "-o", str(tmp_path / "i"), "--task", "toy-chars"])
    assert res.exit_code == 2 and "Invalid value for '--task'" in res.output     # not importable
    site = str(tmp_path / "site")
    sys.path.remove(site)
    try:
        with pytest.raises(ArtifactError) as ei:
            mf.parse((root / "manifest.json").read_bytes())
        assert ei.value.code == "manifest_task_unknown" and "'toy-chars'" in ei.value.message
        res = CliRunner().invoke(main, ["convert", "x.onnx", "-o", "o", "--task", "toy-chars", "--calibration", "c"])
        assert res.exit_code == 2 and "Invalid value for '--task'" in res.output
    finally:
        sys.path.insert(0, site)


def test_broken_plug_in_tasks_are_typed_errors(toy_task):
    from edge_runtime.models import TaskInvalid, get_task, register, unregister

    with pytest.raises(TaskInvalid, match="cannot be loaded"):
        get_task("toy-broken")
    with pytest.raises(TaskInvalid, match="cannot be loaded"):
        get_task("toy-misnamed")
    register("toy-plain", "builtins:dict")
    register("toy-renamed", type(toy_task.__name__, (toy_task,), {"name": "something-else"}))
    try:
        with pytest.raises(TaskInvalid, match="not a subclass of edge_runtime.models.base.Task"):
            get_task("toy-plain")
        with pytest.raises(TaskInvalid, match="declares name 'something-else'"):
            get_task("toy-renamed")
    finally:
        unregister("toy-plain")
        unregister("toy-renamed")
