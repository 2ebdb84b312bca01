"""A tampered, truncated or escaping artifact is refused at load, naming the file."""

import json
import os

import pytest

import edge_runtime as er
from edge_runtime.artifact import load_artifact
from factories import rewrite_manifest


def refused(path, code=None, file=None):
    with pytest.raises(er.ArtifactError) as ei:
        er.load(path, device="fake")
    if code:
        assert ei.value.code == code, ei.value.message
    if file:
        assert file in ei.value.message and ei.value.file == file
    return ei.value


def test_valid_artifact_loads_and_verifies(make_artifact):
    root = make_artifact("tensors")
    art = load_artifact(root)
    assert art.verified and art.task == "tensors"
    with er.load(root, device="fake") as rt:
        assert rt.info()["target"] == "fake"


@pytest.mark.parametrize("task", ["text-classification", "image-classification", "tensors"])
def test_byte_flip_in_every_file_is_refused(make_artifact, task):
    root = make_artifact(task)
    assert json.loads((root / "manifest.json").read_text())["files"]
    flip_each_file(root)
    er.load(root, device="fake").close()   # restored: loads again


def flip_each_file(root) -> list[str]:
    """Flip one bit in each listed file in turn: each is refused naming that file, then restored."""
    files = list(json.loads((root / "manifest.json").read_text())["files"])
    for rel in files:
        p = root / rel
        original = p.read_bytes()
        data = bytearray(original)
        data[len(data) // 2] ^= 0x01
        p.write_bytes(bytes(data))
        err = refused(root, "artifact_hash_mismatch", rel)
        assert "sha256" in err.message
        p.write_bytes(original)
    return files


@pytest.mark.parametrize("task", ["text-classification", "image-classification"])
def test_byte_flip_is_refused_when_files_are_hashed_side_by_side(make_artifact, task, monkeypatch):
    """Files at least PARALLEL_HASH_BYTES large are hashed on threads: every file's flip is still
    found and named, in manifest order, and the intact artifact verifies."""
    import edge_runtime.artifact as artifact_mod

    monkeypatch.setattr(artifact_mod, "PARALLEL_HASH_BYTES", 1)
    monkeypatch.setattr(artifact_mod.os, "cpu_count", lambda: 4)
    root = make_artifact(task)
    load_artifact(root)
    files = flip_each_file(root)
    assert len(files) > 1
    for rel in files[-2:]:                    # two bad files: the first in manifest order is named
        (root / rel).write_bytes(b"\0" * len((root / rel).read_bytes()))
    refused(root, "artifact_hash_mismatch", files[-2])


def test_truncated_and_missing_files(make_artifact):
    root = make_artifact("tensors")
    rel = "fake/static.npz"
    data = (root / rel).read_bytes()
    (root / rel).write_bytes(data[:-10])
    refused(root, "artifact_hash_mismatch", rel)
    os.remove(root / rel)
    refused(root, "artifact_file_missing", rel)


def test_unreadable_manifest_or_folder_is_an_artifact_error(make_artifact, monkeypatch):
    """Without read permission (a mode-000 manifest, a mode-000 folder on the way: root reads
    both, so the OSError is simulated) load refused with a bare PermissionError, exit 1."""
    from pathlib import Path

    art = make_artifact("text-classification")
    real_read, real_exists = Path.read_bytes, Path.exists

    def read_bytes(self):
        if self.name == "manifest.json":
            raise PermissionError(13, "Permission denied")
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(er.ArtifactError) as ei:
        load_artifact(art)
    assert ei.value.code == "artifact_file_unreadable" and "manifest.json" in str(ei.value)
    monkeypatch.setattr(Path, "read_bytes", real_read)

    def exists(self):
        if art in self.parents and self.parent != art:     # a file in a sub-folder: its folder refuses stat
            raise PermissionError(13, "Permission denied")
        return real_exists(self)

    monkeypatch.setattr(Path, "exists", exists)
    with pytest.raises(er.ArtifactError) as ei:
        load_artifact(art)
    assert ei.value.code == "artifact_file_unreadable"
    with pytest.raises(er.ArtifactError) as ei:       # the artifact's own folder inside an unreadable one
        load_artifact(art / "fake" / "x")
    assert ei.value.code == "artifact_file_unreadable"


def test_manifest_problems(make_artifact, tmp_path):
    root = make_artifact("tensors")
    (root / "manifest.json").write_text("{not json")
    refused(root, "manifest_unparsable", "manifest.json")
    os.remove(root / "manifest.json")
    refused(root, "artifact_file_missing", "manifest.json")
    refused(tmp_path / "nope", "artifact_missing")


@pytest.mark.parametrize("mutate,code", [
    (lambda m: m.update(format_version=99), "manifest_version_unknown"),
    (lambda m: m.pop("variants"), "manifest_field_missing"),
    (lambda m: m["model"].pop("version"), "manifest_field_missing"),
    (lambda m: m.update(task="telepathy"), "manifest_task_unknown"),
    (lambda m: m["variants"][0].update(target="quantum-tpu"), "artifact_target_unknown"),
    (lambda m: m["variants"][0]["buckets"][0]["inputs"][0].update(shape=[-1, 4]), "manifest_shape_dynamic"),
    (lambda m: m["variants"][0]["buckets"][0].update(file="elsewhere.npz"), "manifest_field_invalid"),
    (lambda m: m.update(format="zip"), "manifest_format_unknown"),
    (lambda m: m.update(limits={"max_text_chars": 0}), "limit_invalid"),
    (lambda m: m.update(limits={"max_text_chars": None}), "limit_invalid"),
])
def test_manifest_field_tampering(make_artifact, mutate, code):
    root = make_artifact("tensors")
    rewrite_manifest(root, mutate)
    refused(root, code)


@pytest.mark.parametrize("rel", ["../outside.npz", "/etc/passwd", "fake/../../x.npz"])
def test_paths_leaving_the_directory(make_artifact, rel):
    root = make_artifact("tensors")

    def mutate(m):
        m["files"][rel] = {"sha256": "0" * 64, "bytes": 1}
    rewrite_manifest(root, mutate)
    refused(root, "artifact_path_escapes", rel)


def test_symlink_escaping_the_directory(make_artifact, tmp_path):
    root = make_artifact("tensors")
    outside = tmp_path / "outside.npz"
    outside.write_bytes((root / "fake/static.npz").read_bytes())
    os.remove(root / "fake/static.npz")
    os.symlink(outside, root / "fake/static.npz")
    refused(root, "artifact_path_escapes", "fake/static.npz")


def test_duplicate_keys_and_huge_manifest(make_artifact):
    root = make_artifact("tensors")
    text = (root / "manifest.json").read_text()
    (root / "manifest.json").write_text(text.replace('"task":', '"task": "tensors", "task":', 1))
    refused(root, "manifest_duplicate_key")
    (root / "manifest.json").write_text(" " * (5 * 1024 * 1024) + text)
    refused(root, "manifest_too_large")
