"""Artifacts that loaded, or were inspected or diffed, with exit 0 although every load must refuse
them, or that were refused with an untyped crash: each is now an ``ArtifactError`` (exit 3)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime.artifact import load_artifact, safe_relpath, variant_files
from edge_runtime.cli import main
from edge_runtime.manifest import validate
from factories import rewrite_manifest

X = {"x": np.ones((1, 4), np.float32), "k": np.ones((1, 2), np.int32)}


def refused(root, code: str) -> er.ArtifactError:
    with pytest.raises(er.ArtifactError) as ei:
        with er.load(root, device="fake") as rt:
            rt.infer(X if rt.task.name == "tensors" else "good movie")
    assert ei.value.code == code, ei.value.to_dict()
    return ei.value


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_an_unlisted_postprocess_labels_file_is_refused_though_preprocess_names_a_listed_one(make_artifact):
    """Validation read ``preprocess.labels or postprocess.labels``: a listed file under preprocess hid
    the postprocess one, which the task reads, unhashed; a swapped labels file renamed every class."""
    root = make_artifact("text-classification")
    (root / "evil.txt").write_text("positive\nnegative\n")
    rewrite_manifest(root, lambda m: (m["preprocess"].update(labels="labels.txt"),
                                      m["postprocess"].update(labels="evil.txt")))
    err = refused(root, "manifest_field_invalid")
    assert "evil.txt" in err.message and "not listed" in err.message
    assert cli("inspect", root).exit_code == 3


def test_a_task_never_reads_a_file_the_manifest_does_not_list(make_artifact):
    """``Artifact.read_bytes`` (what a task reads its tokenizer and labels with) read any file inside the
    directory: one no sha256 pins is refused, whatever a manifest field or a task asks for."""
    root = make_artifact("text-classification")
    (root / "unpinned.txt").write_text("a\nb\n")
    art = load_artifact(root)
    assert art.read_bytes("labels.txt")         # listed: read as before
    with pytest.raises(er.ArtifactError) as ei:
        art.read_bytes("unpinned.txt")
    assert ei.value.code == "artifact_file_unlisted" and ei.value.file == "unpinned.txt"


def test_two_variants_with_one_target_are_refused(make_artifact):
    """The first was loaded, tuned and verified by that target, the second never: which one runs was
    an accident of order, and diff compared them by position."""
    root = make_artifact("tensors")
    rewrite_manifest(root, lambda m: m["variants"].append(json.loads(json.dumps(m["variants"][0]))))
    assert "fake" in refused(root, "manifest_field_invalid").message
    assert cli("diff", root, root).exit_code == 3


def test_two_buckets_of_a_variant_with_one_name_are_refused(make_artifact):
    root = make_artifact("text-classification")
    rewrite_manifest(root, lambda m: m["variants"][0]["buckets"][1].update(name="seq8"))
    assert "seq8" in refused(root, "manifest_field_invalid").message


def test_a_bucket_without_outputs_or_inputs_is_refused(make_artifact):
    """No outputs: the load passed and every ``infer`` answered an empty result, exit 0."""
    for side in ("outputs", "inputs"):
        root = make_artifact("tensors")
        rewrite_manifest(root, lambda m: m["variants"][0]["buckets"][0].update({side: []}))
        assert f"no {side}" in refused(root, "manifest_field_invalid").message


@pytest.mark.parametrize("shape", [[1, 10**18], [10**10, 10**10, 10**10]])
def test_a_tensor_no_device_can_allocate_is_refused_at_validation(make_artifact, shape):
    """A static shape of 10^18 elements passed validation; the warm-up's numpy died on it with an
    untyped MemoryError ("Unable to allocate 3.47 EiB") or ValueError ("array is too big")."""
    root = make_artifact("tensors")
    rewrite_manifest(root, lambda m: m["variants"][0]["buckets"][0]["inputs"][0].update(shape=shape))
    assert "elements" in refused(root, "manifest_field_invalid").message


def test_the_element_cap_is_int32_sizes(make_artifact):
    """Validation alone (nothing allocated): 2**31 - 1 elements pass, one more is refused."""
    root = make_artifact("tensors")
    man = json.loads((root / "manifest.json").read_text())
    spec = man["variants"][0]["buckets"][0]["inputs"][0]
    spec["shape"] = [1, 2**31 - 1]
    validate(man)
    spec["shape"] = [2, 2**30]
    with pytest.raises(er.ArtifactError) as ei:
        validate(man)
    assert ei.value.code == "manifest_field_invalid" and "elements" in ei.value.message


def test_a_lone_surrogate_in_a_path_or_a_name_is_refused_typed(make_artifact, tmp_path):
    """A JSON ``\\ud800`` escape parses to a string no file system or terminal encodes: as a file path
    the load died with UnicodeEncodeError; as the model's name inspect did (exit 1, ``unexpected``)."""
    root = make_artifact("tensors")
    rewrite_manifest(root, lambda m: m["files"].update({"\ud800x.npz": {"sha256": "0" * 64, "bytes": 1}}))
    refused(root, "manifest_field_invalid")
    root = make_artifact("tensors")
    rewrite_manifest(root, lambda m: m["model"].update(name="tiny\ud800"))
    refused(root, "manifest_field_invalid")
    res = cli("inspect", root)
    assert res.exit_code == 3 and "manifest_field_invalid" in res.output, res.output
    with pytest.raises(er.ArtifactError) as ei:        # a writer's or a caller's own path
        safe_relpath(tmp_path, "a\ud800.bin")
    assert ei.value.code == "artifact_path_invalid"


def test_inspect_shows_the_first_label_without_its_bom(make_artifact):
    """The runtime reads labels as ``utf-8-sig``; inspect read plain UTF-8 and showed '\\ufeffnegative'."""
    root = make_artifact("text-classification")
    data = "\ufeffnegative\r\npositive\r\n".encode()
    (root / "labels.txt").write_bytes(data)
    rewrite_manifest(root, lambda m: m["files"]["labels.txt"].update(sha256=hashlib.sha256(data).hexdigest(),
                                                                     bytes=len(data)))
    with er.load(root, device="fake") as rt:
        runtime_labels = rt.task.labels
    res = cli("inspect", root, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["labels"]["first"] == runtime_labels == ["negative", "positive"]
    assert "\ufeff" not in cli("inspect", root).output


def test_inspect_refuses_limits_every_load_refuses(make_artifact):
    """inspect said "all sha256 verified", exit 0, of an artifact whose limit of 0 fails every load."""
    root = make_artifact("tensors", limits={"max_text_chars": 5})
    rewrite_manifest(root, lambda m: m["limits"].update(max_text_chars=0))
    refused(root, "limit_invalid")
    res = cli("inspect", root)
    assert res.exit_code == 3 and "limit_invalid" in res.output, res.output


def test_diff_refuses_a_target_no_backend_knows(make_artifact):
    """inspect refused it, diff compared it: a copy of an artifact no load accepts was 'same', exit 0."""
    root = make_artifact("tensors")
    rewrite_manifest(root, lambda m: m["variants"][0].update(target="quantum-tpu"))
    refused(root, "artifact_target_unknown")
    res = cli("diff", root, root)
    assert res.exit_code == 3 and "artifact_target_unknown" in res.output, res.output


def test_a_model_file_that_is_also_the_probe_file_is_hashed_before_the_device_reads_it(make_artifact):
    """``variant_files`` dropped the probe's files after the variant's own: a bucket file that is also
    a probe file was left to the background hash, after the device had read it."""
    root = make_artifact("tensors")
    man = json.loads((root / "manifest.json").read_text())
    variant = man["variants"][0]
    man["probe"] = {"inputs": variant["buckets"][0]["file"], "reference": "x.npz", "samples": 1}
    assert variant["buckets"][0]["file"] in variant_files(man, variant)


def test_inspect_refuses_labels_the_task_refuses_at_every_load(make_artifact):
    """Three labels for a two-class model: every load refused it (``artifact_labels_mismatch``), inspect
    listed the three labels, "all sha256 verified", exit 0."""
    root = make_artifact("text-classification")
    data = b"negative\npositive\nneutral\n"
    (root / "labels.txt").write_bytes(data)
    rewrite_manifest(root, lambda m: m["files"]["labels.txt"].update(sha256=hashlib.sha256(data).hexdigest(),
                                                                     bytes=len(data)))
    refused(root, "artifact_labels_mismatch")
    res = cli("inspect", root)
    assert res.exit_code == 3 and "artifact_labels_mismatch" in res.output, res.output


def test_an_image_layout_other_than_nchw_or_nhwc_is_refused_at_load(make_artifact):
    """``preprocess.layout: "XYZ"`` loaded and was read as NHWC (the convert-time check never ran at load)."""
    import edge_runtime as er
    from factories import rewrite_manifest

    art = make_artifact("image-classification")
    rewrite_manifest(art, lambda m: m["preprocess"].update(layout="XYZ"))
    with pytest.raises(er.ArtifactError, match="preprocess.layout 'XYZ'") as ei:
        er.load(art, device="fake")
    assert ei.value.code == "manifest_field_invalid"
