"""Corrupt *real* artifacts: every file of artifacts the real converters built
(OpenVINO + ONNX Runtime digits, the MiniLM text model, an imported Coral
TFLite model, a Core ML package) is byte-flipped, truncated and deleted, and
the manifest is flipped at every byte. Each case must be refused by
``er.load`` with an ``ArtifactError`` naming the file: the chosen variant's
files before the device sees them, the other variants' files before load
returns. Factory-artifact tampering (fields, traversal, symlinks, huge
manifests, duplicate keys) is in test_artifact.py."""

from __future__ import annotations

import json
import os
import random
import shutil

import pytest

import edge_runtime as er
from edge_runtime.artifact import variant_files
from conftest import ZOO, add_coreml_twins
from factories import rewrite_manifest

REAL = [  # artifact fixture, device to load it on (None: auto)
    ("ov_digits_artifact", None),            # openvino chosen, onnx-int8 the other variant
    ("ov_digits_artifact", "onnxruntime"),   # and the other way round
    ("coral_artifact", "tflite"),
    pytest.param("minilm_embedding_artifact", "onnxruntime", marks=pytest.mark.slow),
    ("coreml_faked_digits_artifact", "coreml-faked"),
]


def _files(root):
    return list(json.loads((root / "manifest.json").read_text())["files"])


def _refused(root, device, rel, how):
    with pytest.raises(er.ArtifactError) as ei:
        er.load(root, device=device or "auto").close()
    err = ei.value
    assert err.file == rel and rel in err.message, f"{how} {rel}: refused naming {err.file!r}: {err.message}"
    return err


@pytest.fixture
def real_copy(request, tmp_path):
    """A private copy of a session-scoped real artifact (the sweep writes into it)."""
    def copy(fixture):
        src = request.getfixturevalue(fixture)
        dst = tmp_path / fixture
        shutil.copytree(src, dst, symlinks=True)
        if fixture == "coreml_faked_digits_artifact":     # the faked Core ML boundary knows packages by path
            add_coreml_twins(request.getfixturevalue("coreml_fake"), dst, ZOO / "digits-cnn" / "model.onnx")
        return dst
    return copy


@pytest.mark.parametrize("fixture,device", REAL)
def test_every_file_flipped_truncated_or_deleted_is_refused(real_copy, fixture, device):
    root = real_copy(fixture)
    with er.load(root, device=device or "auto") as rt:        # intact: loads
        chosen = set(variant_files(rt.artifact.manifest, rt.variant))
    files = _files(root)
    assert len(files) >= 2
    rng = random.Random(fixture)
    cases = 0
    for rel in files:
        p = root / rel
        original = p.read_bytes()
        n = len(original)
        extra = 3 if n < (1 << 20) else 0          # each flip of a 33 MB weight file costs a full hash
        positions = sorted({0, n - 1, n // 2, *(rng.randrange(n) for _ in range(extra))}) if n else []
        for pos in positions:
            data = bytearray(original)
            data[pos] ^= 1 << rng.randrange(8)
            p.write_bytes(bytes(data))
            err = _refused(root, device, rel, f"flip at {pos} of")
            assert err.code == "artifact_hash_mismatch" and "sha256" in err.message
            cases += 1
        if n:
            p.write_bytes(original[: n - 1 - rng.randrange(n)])
            assert _refused(root, device, rel, "truncated").code == "artifact_hash_mismatch"
            p.write_bytes(original + b"\0")
            assert _refused(root, device, rel, "grown").code == "artifact_hash_mismatch"
            cases += 2
        os.remove(p)
        assert _refused(root, device, rel, "deleted").code == "artifact_file_missing"
        p.write_bytes(original)
        cases += 1
    assert cases >= 4 * len(files)
    assert set(files) - chosen or fixture != "ov_digits_artifact", "the other variant's files were swept too"
    er.load(root, device=device or "auto").close()            # restored: loads again


@pytest.mark.parametrize("fixture,device", [("ov_digits_artifact", None), ("coral_artifact", "tflite")])
def test_a_bit_flip_anywhere_in_the_manifest_is_refused(real_copy, fixture, device):
    root = real_copy(fixture)
    mpath = root / "manifest.json"
    original = mpath.read_bytes()
    content = json.loads(original)
    codes, same = {}, []
    for pos in range(len(original)):          # every byte, a different bit each time
        data = bytearray(original)
        data[pos] ^= 1 << (pos % 8)
        mpath.write_bytes(bytes(data))
        if _same_content(bytes(data), content):
            # e.g. "1e-05" -> "1E-05": the bytes changed, the manifest did not; it loads as the same manifest
            same.append(pos)
            er.load(root, device=device or "auto").close()
            continue
        err = _refused(root, device, "manifest.json", f"manifest flip at {pos}")
        codes[err.code] = codes.get(err.code, 0) + 1
    mpath.write_bytes(original)
    er.load(root, device=device or "auto").close()
    assert sum(codes.values()) + len(same) == len(original) and "manifest_seal_mismatch" in codes, codes
    assert all(chr(original[p]) in "eE" for p in same), [chr(original[p]) for p in same]


def _same_content(data: bytes, content) -> bool:
    try:
        return json.loads(data) == content
    except ValueError:
        return False


def test_a_resealed_edit_is_still_validated_and_an_unsealed_one_refused(real_copy):
    root = real_copy("ov_digits_artifact")
    rewrite_manifest(root, lambda m: m["postprocess"].update(labels="elsewhere.txt"))   # re-sealed
    assert _refused(root, None, "manifest.json", "labels").code == "manifest_field_invalid"
    rewrite_manifest(root, lambda m: m["postprocess"].update(labels="labels.txt"))
    er.load(root).close()
    rewrite_manifest(root, lambda m: m["model"].update(version="9"), reseal=False)
    assert _refused(root, None, "manifest.json", "version").code == "manifest_seal_mismatch"
    rewrite_manifest(root, lambda m: m.pop("manifest_sha256"), reseal=False)
    assert _refused(root, None, "manifest.json", "seal").code == "manifest_unsealed"


def test_a_model_file_swapped_for_a_symlink_outside_is_refused(real_copy, tmp_path):
    root = real_copy("ov_digits_artifact")
    for rel in ("openvino/static.bin", "onnx-int8/static.onnx"):
        outside = tmp_path / rel.replace("/", "-")
        shutil.copyfile(root / rel, outside)            # same bytes, same hash: only the link is wrong
        os.rename(root / rel, tmp_path / "kept")
        os.symlink(outside, root / rel)
        assert _refused(root, None, rel, "symlinked").code == "artifact_path_escapes"
        os.remove(root / rel)
        os.rename(tmp_path / "kept", root / rel)
    er.load(root).close()


def test_a_corrupt_other_variant_fails_the_load_after_the_device_loaded(real_copy, monkeypatch):
    """The other variants' files are hashed while the device loads; a bad one still
    fails load() (and closes what was opened) instead of being noticed never."""
    root = real_copy("ov_digits_artifact")
    closed = []
    from edge_runtime import runtime as rtmod
    real_close = rtmod.Runtime.close
    monkeypatch.setattr(rtmod.Runtime, "close", lambda self: (closed.append(self.device), real_close(self)))
    p = root / "onnx-int8/static.onnx"
    data = bytearray(p.read_bytes())
    data[100] ^= 0x10
    p.write_bytes(bytes(data))
    err = _refused(root, "openvino", "onnx-int8/static.onnx", "other variant")
    assert err.code == "artifact_hash_mismatch" and closed and closed[0].startswith("openvino")
