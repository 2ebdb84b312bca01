"""Artifact integrity holes (each test failed before its fix): a bucket repeating an input name loaded,
and a file edited in place between its hash and the backend's read ran bytes no hash had checked."""

from __future__ import annotations

import json
import os
import time

import pytest

import edge_runtime as er
from edge_runtime import error_codes as ec
from edge_runtime.artifact import BackgroundVerify, load_artifact, verify_files
from edge_runtime.devices import registry
from edge_runtime.manifest import dumps, parse
from factories import rewrite_manifest
from fake_backend import FakeBackend


# -- 1. a repeated input name -----------------------------------------------------------------------

def _repeat_input(m):
    b = m["variants"][0]["buckets"][1]
    b["inputs"][2] = dict(b["inputs"][1])        # token_type_ids -> a second attention_mask


def test_a_bucket_repeating_an_input_name_is_refused_at_read(make_artifact):
    """Feeds are keyed by name: a bucket declaring ``attention_mask`` twice loaded (one array fed to
    both, ``token_type_ids`` never), or failed at warm-up with an unclear error."""
    root = make_artifact("text-classification")
    rewrite_manifest(root, _repeat_input)
    for attempt in (lambda: load_artifact(root, verify=False), lambda: er.load(root, device="fake")):
        with pytest.raises(er.ArtifactError) as ei:
            attempt()
        err = ei.value
        assert err.code == ec.MANIFEST_FIELD_INVALID and err.file == "manifest.json"
        assert "buckets[1]" in err.message and "'seq16'" in err.message and "'attention_mask'" in err.message
    data = json.loads((root / "manifest.json").read_text())
    with pytest.raises(er.ArtifactError):
        dumps(data)                              # nor can a converter write one


def test_only_inputs_must_be_unique_outputs_sharing_a_name_still_load(make_artifact):
    """Outputs are matched by position (diff, tasks): a repeated output name stays accepted, in the
    same manifest whose repeated input is refused."""
    root = make_artifact("tensors")

    def two_outputs(m):
        b = m["variants"][0]["buckets"][0]
        b["outputs"] = [b["outputs"][0], dict(b["outputs"][0])]

    rewrite_manifest(root, two_outputs)
    parse((root / "manifest.json").read_bytes())
    assert load_artifact(root).verified
    rewrite_manifest(root, lambda m: m["variants"][0]["buckets"][0]["inputs"].append(
        dict(m["variants"][0]["buckets"][0]["inputs"][0])))
    with pytest.raises(er.ArtifactError) as ei:
        load_artifact(root)
    assert ei.value.code == ec.MANIFEST_FIELD_INVALID and "two inputs" in ei.value.message




# -- 2. a file changed after it was hashed ----------------------------------------------------------

def _aged(root, rel):
    """The file as an artifact built a while ago has it (its mtime in the past): an edit made now is
    then visible whatever the file system's timestamp tick."""
    p = root / rel
    old = p.stat().st_mtime_ns - 10**10
    os.utime(p, ns=(old, old))
    time.sleep(0.03)                            # past the coarse clock's tick: a later write moves ctime
    return p


def _model(art) -> str:
    return art.variants[0]["buckets"][0]["file"]


def _edit_in_place(p):
    """Same size, other bytes, same inode: what a hard link edited or a build writing into the directory does."""
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF
    with open(p, "r+b") as fh:
        fh.write(bytes(data))


def _replace(p, same: bool = False):
    tmp = p.with_name(p.name + ".new")
    data = p.read_bytes()
    tmp.write_bytes(data if same else data[:-1] + bytes([data[-1] ^ 1]))     # another file, other bytes
    os.replace(tmp, p)


def test_a_file_rewritten_with_the_same_bytes_still_loads(make_artifact):
    """coremltools writes an ``.mlpackage``'s ``Manifest.json`` back (in place, new times, the same bytes)
    each time it opens the package: a changed stamp is hashed again, and only other bytes fail."""
    from edge_runtime.artifact import check_unchanged

    root = make_artifact("text-classification")
    art = load_artifact(root, verify=False)
    rel = _model(art)
    p = _aged(root, rel)
    stamps = verify_files(art)
    _replace(p, same=True)
    check_unchanged(art, stamps)
    p.write_bytes(p.read_bytes())       # in place, as coremltools does
    check_unchanged(art, stamps)


def _edit_keeping_mtime(p):
    st = p.stat()
    _edit_in_place(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))    # rsync --inplace -t, cp -p over it: ctime tells


@pytest.mark.parametrize("change", [_edit_in_place, _replace, _edit_keeping_mtime,
                                    lambda p: p.write_bytes(p.read_bytes()[:-1]), os.unlink],
                         ids=["in-place", "replaced", "mtime-restored", "truncated", "deleted"])
def test_a_file_changed_after_its_hash_is_refused(make_artifact, change):
    from edge_runtime.artifact import check_unchanged

    root = make_artifact("text-classification")
    art = load_artifact(root, verify=False)
    rel = _model(art)
    p = _aged(root, rel)
    stamps = verify_files(art)
    assert set(stamps) == set(art.manifest["files"])
    check_unchanged(art, stamps)                # untouched: passes
    change(p)
    with pytest.raises(er.ArtifactError) as ei:
        check_unchanged(art, stamps)
    assert ei.value.code == ec.ARTIFACT_HASH_MISMATCH and ei.value.file == rel
    assert "changed after it was hashed" in ei.value.message


def test_an_untouched_artifact_passes_and_a_read_does_not_count_as_a_change(make_artifact):
    from edge_runtime.artifact import check_unchanged

    root = make_artifact("text-classification")
    art = load_artifact(root, verify=False)
    stamps = verify_files(art, [_model(art), "tokenizer.json"])
    assert set(stamps) == {_model(art), "tokenizer.json"}
    art.read_bytes("tokenizer.json")
    (root / _model(art)).read_bytes()
    check_unchanged(art, stamps)


def test_the_background_verify_records_the_same_stamps(make_artifact):
    """The other variants' files, hashed on a thread during the load, are held to the same record."""
    from edge_runtime.artifact import check_unchanged

    root = make_artifact("text-classification")
    art = load_artifact(root, verify=False)
    rel = _model(art)
    p = _aged(root, rel)
    bg = BackgroundVerify(art, [rel, "labels.txt"])
    bg.wait()
    assert set(bg.stamps) == {rel, "labels.txt"}
    check_unchanged(art, bg.stamps)
    _edit_in_place(p)
    with pytest.raises(er.ArtifactError) as ei:
        check_unchanged(art, bg.stamps)
    assert ei.value.code == ec.ARTIFACT_HASH_MISMATCH and ei.value.file == rel


def test_the_stamp_is_of_the_bytes_hashed_not_of_a_later_look(make_artifact, monkeypatch):
    """A write landing while the file is hashed: the stamp was taken before the first byte was read,
    so the check sees the write (a stamp taken after the hash would have adopted it)."""
    import hashlib

    from edge_runtime import artifact as am

    root = make_artifact("text-classification")
    art = load_artifact(root, verify=False)
    rel = _model(art)
    p = _aged(root, rel)
    real = hashlib.file_digest

    def digest_then_write(fh, name):
        out = real(fh, name)
        if os.path.samefile(fh.name, p):
            _edit_in_place(p)       # after the digest: only a stamp taken before the first byte tells
        return out

    monkeypatch.setattr(am.hashlib, "file_digest", digest_then_write)
    stamps = verify_files(art, [rel])
    monkeypatch.setattr(am.hashlib, "file_digest", real)
    with pytest.raises(er.ArtifactError) as ei:
        am.check_unchanged(art, stamps)
    assert ei.value.file == rel


# -- the load, end to end (runs once runtime.py calls check_unchanged) -----------------------------

class _EditsOnOpen(FakeBackend):
    """A build writing into the artifact while the device loads it: the model named ``edits`` is
    edited in place after load() hashed it and before the backend reads it."""
    name = "fake-edits"
    edits = ""

    def open(self, model_path, bucket, sub, options):
        if model_path.name == self.edits:
            _edit_in_place(model_path)
        return super().open(model_path, bucket, sub, options)


@pytest.fixture
def editing_backend():
    registry.register("fake-edits", _EditsOnOpen)
    yield _EditsOnOpen
    registry.unregister("fake-edits")
    _EditsOnOpen.edits = ""


def _wired() -> bool:
    from edge_runtime import runtime

    return hasattr(runtime, "check_unchanged")


@pytest.mark.skipif(not _wired(), reason="runtime.py does not call artifact.check_unchanged yet")
def test_load_refuses_a_model_edited_between_its_hash_and_the_backend(make_artifact, editing_backend):
    root = make_artifact("text-classification")
    rel = _model(load_artifact(root, verify=False))
    editing_backend.edits = _aged(root, rel).name
    with pytest.raises(er.ArtifactError) as ei:
        er.load(root, device="fake-edits")
    assert ei.value.code == ec.ARTIFACT_HASH_MISMATCH and ei.value.file == rel
    root2 = make_artifact("text-classification")
    with er.load(root2, device="fake") as rt:           # untouched: loads and answers as before
        assert rt.infer("good movie")
