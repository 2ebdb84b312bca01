"""The converter seam (issue #16): a declared protocol (``converters/base.py``), typed
build records, no probing. A converter written as one file outside the package and
registered by one entry point converts digits-cnn through the real pipeline, and the
artifact loads and runs; the registry refuses what is not a Converter."""

import ast
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import edge_runtime as er
from conftest import ROOT

CONVERTERS = ROOT / "converters"
# the modules that drive converters: every member they use must be declared by the base
DRIVERS = ("pipeline.py", "build_variant.py", "convert_inputs.py", "request.py", "parity_trials.py")

TOY = '''
import shutil

from edge_runtime.converters.base import BucketBuild, Converter


class ToyConverter(Converter):
    """The least a converter is: build_bucket and toolchain. It ships the fp32 bucket as is."""
    target = "onnx-int8"

    def build_bucket(self, fp32_path, out_path, calibration_feeds, ctx):
        shutil.copyfile(fp32_path, out_path)
        return BucketBuild({"scheme": "toy: the fp32 bucket, copied", "weights": "float32",
                            "activations": "float32", "recipe": ctx.recipe or "copy",
                            "calibration_feeds": len(calibration_feeds), "task": ctx.task})

    def toolchain(self):
        return {"toy": "1.0"}


class DictConverter(ToyConverter):
    def build_bucket(self, fp32_path, out_path, calibration_feeds, ctx):
        shutil.copyfile(fp32_path, out_path)
        return {"scheme": "a dict, the old way"}


class Incomplete(Converter):
    def build_bucket(self, fp32_path, out_path, calibration_feeds, ctx):
        raise AssertionError("never built")


class NotAConverter:
    target = "onnx-int8"

    def build_bucket(self, *a):
        raise AssertionError("never built")

    def toolchain(self):
        return {}
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """Install a temporary distribution: one module file and a .dist-info whose
    entry_points.txt names its converters in the ``edge_runtime.converters`` group."""
    made = []

    def install(entries: dict, code: str = TOY) -> str:
        n = len(made)
        mod = f"toy_converter_{n}_{abs(hash(str(tmp_path))) % 10**8}"
        site = tmp_path / f"site{n}"
        (site / f"toy_converters-{n}.0.dist-info").mkdir(parents=True)
        (site / f"{mod}.py").write_text(textwrap.dedent(code))
        info = site / f"toy_converters-{n}.0.dist-info"
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: toy-converters\nVersion: {n}.0\n")
        (info / "entry_points.txt").write_text("[edge_runtime.converters]\n" + "".join(
            f"{target} = {ref.replace('MOD', mod)}\n" for target, ref in entries.items()))
        monkeypatch.syspath_prepend(str(site))
        made.append(mod)
        return mod

    yield install
    for mod in made:
        sys.modules.pop(mod, None)


def _digits(out, **kw):
    from edge_runtime.converters.zoo import convert_request

    return convert_request("digits-cnn", "image-classification", out, targets=["onnx-int8"], **kw)


# -- a converter is one file and one entry point ---------------------------------

def test_a_one_file_converter_from_an_entry_point_builds_an_artifact_that_runs(plugin, tmp_path):
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.registry import converter_targets, get_converter

    mod = plugin({"onnx-int8": "MOD:ToyConverter"})
    assert converter_targets()["onnx-int8"] == f"{mod}:ToyConverter"   # another distribution's entry wins
    assert type(get_converter("onnx-int8")).__name__ == "ToyConverter"
    man = convert(_digits(tmp_path / "toy"))
    (v,) = man["variants"]
    q = v["quantization"]
    assert q["scheme"] == "toy: the fp32 bucket, copied" and q["recipe"] == "copy" and q["task"] == "image-classification"
    assert q["calibration_feeds"] == 200 == q["calibration"]["samples"]
    assert v["toolchain"]["toy"] == "1.0" and "edge-runtime" in v["toolchain"]
    b = v["buckets"][0]   # tensors read by the base's describe (the built ONNX)
    assert b["file"] == "onnx-int8/static.onnx" and b["inputs"][0]["shape"] == [1, 1, 8, 8]
    assert v["parity"]["value"] == 1.0 and v["parity"]["passed"] is True    # the fp32 model against itself
    assert "runtime" not in v
    img = sorted((ROOT / "models/zoo/digits-cnn/held_out/3").iterdir())[0]
    with er.load(tmp_path / "toy", device="onnxruntime", strict=True) as rt:
        res = rt.infer(str(img))
        assert rt.variant["target"] == "onnx-int8" and res.device.startswith("onnxruntime")
        assert res.prediction in rt.task.labels and np.isfinite(list(res.scores.values())).all()


def test_a_build_that_returns_no_bucketbuild_is_refused(plugin, tmp_path):
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.registry import ConverterInvalid

    plugin({"onnx-int8": "MOD:DictConverter"})
    with pytest.raises(ConverterInvalid, match="build_bucket returned dict, not a BucketBuild"):
        convert(_digits(tmp_path / "d"))
    assert not (tmp_path / "d").exists() and not list(tmp_path.glob(".d.*"))


# -- the registry ------------------------------------------------------------------

def test_get_converter_refuses_what_is_not_a_converter(plugin):
    from edge_runtime.converters.registry import ConverterInvalid, UnknownTarget, get_converter

    plugin({"toy-plain": "MOD:NotAConverter", "toy-half": "MOD:Incomplete", "toy-gone": "no_such_module_xyz:C",
            "toy-attr": "MOD:Missing"})
    with pytest.raises(ConverterInvalid, match="not a subclass of edge_runtime.converters.base.Converter"):
        get_converter("toy-plain")
    with pytest.raises(ConverterInvalid, match="cannot be made: TypeError.*toolchain"):
        get_converter("toy-half")                       # an abstract member left undefined
    for name in ("toy-gone", "toy-attr"):
        with pytest.raises(ConverterInvalid, match="cannot be loaded"):
            get_converter(name)
    with pytest.raises(UnknownTarget) as ei:
        get_converter("quantum-tpu")
    assert isinstance(ei.value, er.InputError) and ei.value.code == "convert_target_unknown"
    assert "'quantum-tpu'" in ei.value.message and "onnx-int8" in ei.value.message


def test_every_built_in_converter_is_a_converter():
    from edge_runtime.converters.base import Converter
    from edge_runtime.converters.registry import _BUILTIN, converter_targets, get_converter

    assert set(_BUILTIN) <= set(converter_targets())
    for target in _BUILTIN:
        c = get_converter(target)
        assert isinstance(c, Converter) and c.target == target and isinstance(tuple(c.recipes), tuple)
        assert c.fallback_target in (None, *_BUILTIN)


# -- the base declares what the pipeline uses ------------------------------------------

def _converter_members(tree) -> set[str]:
    """Attributes read off a converter: ``converter.X`` and ``get_converter(t).X``."""
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            v = node.value
            if (isinstance(v, ast.Name) and v.id == "converter") or (
                    isinstance(v, ast.Call) and getattr(v.func, "id", None) == "get_converter"):
                used.add(node.attr)
    return used


def test_the_base_declares_every_member_the_pipeline_uses():
    from edge_runtime.converters.base import Converter

    used = set()
    for name in DRIVERS:
        tree = ast.parse((CONVERTERS / name).read_text())
        used |= _converter_members(tree)
        for node in ast.walk(tree):   # no probing: getattr/hasattr on a converter
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr"):
                arg = ast.unparse(node.args[0])
                assert "converter" not in arg.lower(), f"{name}: {ast.unparse(node)}"
    assert {"unavailable", "fallback_target", "recipes", "parity_unavailable", "runtime_candidates",
            "parity_stand_in", "describe", "build_bucket", "suffix"} <= used
    missing = sorted(m for m in used if not hasattr(Converter, m))
    assert not missing, f"used by the pipeline but not declared by Converter: {missing}"


def test_the_base_defaults():
    from edge_runtime.converters.base import BucketBuild, BuildContext, Converter

    class Minimal(Converter):
        def build_bucket(self, fp32_path, out_path, calibration_feeds, ctx):
            return BucketBuild({})

        def toolchain(self):
            return {}

    c = Minimal()
    assert (c.recipes, c.fallback_target, c.suffix) == ((), None, ".onnx")
    assert c.unavailable() is None and c.parity_unavailable() is None
    assert c.runtime_candidates() == [{}] and c.parity_stand_in([{}]) is None and c.default_recipe("tensors") is None
    io = c.describe(ROOT / "models/zoo/digits-cnn/model.onnx")
    assert io.inputs[0]["name"] and io.outputs and io.extra_files == ()
    ctx = BuildContext(task="tensors", work=Path("."))
    with pytest.raises(AttributeError):
        ctx.recipe = "x"                                  # frozen: a build cannot change what the next one sees
    with pytest.raises(AttributeError):
        BucketBuild({}).entry = "x"


# -- recorded provenance is kept apart from the options ---------------------------------

def test_runtime_choice_keeps_why_out_of_the_options():
    from edge_runtime.converters.build_variant import runtime_record
    from edge_runtime.converters.parity_trials import Measured, _pick_runtime

    trials = [({"precision": "f32"}, {"value": 1.0, "device_ms_median": 10.0}),
              ({"precision": "bf16"}, {"value": 1.0, "device_ms_median": 5.0})]
    opts, par, why = _pick_runtime(trials, 0.99)
    assert opts == {"precision": "bf16"} and par is trials[1][1] and why.startswith("fastest within the parity budget")
    # the manifest keeps today's shape: the OpenVINO backend reads "why" as the precision's reason
    assert runtime_record(Measured(par, opts, why, trials)) == {"precision": "bf16", "why": why}
    assert runtime_record(Measured(par, {"precision": "f32"}, None, trials[:1])) == {"precision": "f32"}
    opts, _, why = _pick_runtime([trials[0], ({"precision": "bf16"}, {"value": 1.0, "device_ms_median": 9.5})], 0.99)
    assert opts == {"precision": "f32"} and why                   # not >10% faster: the exact one, and why
    opts, _, why = _pick_runtime([({}, {"value": 0.5, "device_ms_median": 1.0})], 0.99)
    assert opts == {} and why is None
