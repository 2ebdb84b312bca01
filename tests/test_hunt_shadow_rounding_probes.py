"""Never a difference reported as none, never probe bytes run unverified:

1. ``shadow_compare``: each input's ``margin``, ``score_a``, ``score_b``, ``score_diff`` were
   ``round(x, 6)``: a score_diff of 4e-7 was 0.0, a margin of -4e-7 (B flipped) -0.0; ``badness``
   (the worst-N ranking key) tied inputs 1e-7 and 3e-7 apart; a detector's F1 of 0.8999996 read 0.9
   beside ``agree: false``.
2. ``shadow_report._fmt``: fixed decimals showed a 0.0004 ms latency "0.000", a 4e-7 score diff
   "0.0000", a cosine of 0.99996 "1.0000".
3. ``verify``: the probe files were hashed, then read again: a file changed in between was parsed
   unverified. Each probe file is now read once, and the bytes hashed are the bytes parsed.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest

from edge_runtime import probe as probe_mod
from edge_runtime import verify
from edge_runtime.errors import ArtifactError, DeviceError
from edge_runtime.shadow_compare import compare
from edge_runtime.shadow_report import _fmt, render
from edge_runtime.shadow_summary import ShadowSummary

pytestmark = pytest.mark.usefixtures("own_cache")


def _cls(cid: int, scores: dict[int, float]) -> dict:
    top = [{"index": i, "score": p} for i, p in sorted(scores.items(), key=lambda t: -t[1])]
    return {"class_id": cid, "prediction": str(cid), "top_k": top}


# -- 1. per-input figures: significant digits, the ranking key unrounded -------------------------------
def test_a_tiny_score_diff_and_a_tiny_flip_are_never_written_as_zero():
    a = _cls(0, {0: 0.6, 1: 0.4})
    c = compare(a, _cls(0, {0: 0.5999996, 1: 0.4000004}))
    assert c["agree"] and c["score_diff"] > 0 and math.isclose(c["score_diff"], 4e-7, rel_tol=1e-6)
    assert c["score_b"] == 0.5999996            # its own digits (was 0.6: B's score as A's)
    flip = compare(_cls(0, {0: 0.5, 1: 0.5}), _cls(1, {1: 0.5000002, 0: 0.4999998}))
    assert not flip["agree"]
    assert flip["margin"] < 0 and math.isclose(flip["margin"], -4e-7, rel_tol=1e-6)      # was -0.0
    assert flip["badness"] > 0
    text = json.dumps(flip)
    assert '"margin": -0.0' not in text and '"margin": -4' in text


def test_the_worst_ranking_tells_apart_inputs_a_fraction_of_a_millionth_apart():
    a = _cls(0, {0: 0.5, 1: 0.5})
    small = compare(a, _cls(1, {1: 0.50000005, 0: 0.49999995}))       # flips by 1e-7
    large = compare(a, _cls(1, {1: 0.50000015, 0: 0.49999985}))       # flips by 3e-7
    assert large["badness"] > small["badness"] > 0                     # both were 0.0: ranked by index
    s = ShadowSummary(worst_n=1)
    ok = {"latency_ms": 1.0, "prediction": "0", "class_id": 0}
    for i, cmp in enumerate((small, large)):
        s.add({"index": i, "id": str(i), "agree": False, "truth": None, "compare": cmp,
               "a": {"ok": True, "result": ok}, "b": {"ok": True, "result": dict(ok, class_id=1, prediction="1")}})
    assert [e["index"] for e in s.to_dict()["worst"]] == [1]


def test_an_embedding_a_hair_off_ranks_worse_than_an_identical_one():
    same = compare({"embedding": [1.0, 0.0]}, {"embedding": [1.0, 0.0]})
    off = compare({"embedding": [1.0, 0.0]}, {"embedding": [1.0, 9e-4]})     # cosine 1 - 4.05e-7
    assert same["badness"] == 0.0 and off["badness"] > 0 and off["cosine"] < 1.0 and off["agree"]


def test_a_detector_f1_just_under_agree_at_is_never_written_as_it(monkeypatch):
    from edge_runtime.models import object_detection

    monkeypatch.setattr(object_detection, "detection_parity",
                        lambda ref, cand: {"value": 0.8999996, "mean_iou": 0.9, "matched": 9})
    box = [{"label": "a", "class_id": 0, "score": 0.9, "box": [0, 0, 1, 1]}]
    c = compare({"detections": box}, {"detections": box}, agree_at=0.9)
    assert c["agree"] is False and c["f1"] < 0.9           # was 0.9 beside agree: false


# -- 2. the HTML report's numbers ----------------------------------------------------------------------
def test_fmt_shows_small_values_by_their_significant_digits_and_ordinary_ones_as_before():
    assert _fmt(0.0004, 3) == "0.0004" and _fmt(4e-7) == "4e-07" and _fmt(-4e-5) == "-4e-05"
    assert _fmt(0.000123456, 3) == "0.000123"
    assert _fmt(12.34567, 3) == "12.346" and _fmt(0.5) == "0.5000" and _fmt(0.0) == "0.0000"
    assert _fmt(0.98765) == "0.9877" and _fmt(1.0, one=True) == "1.0000" and _fmt(3) == "3" and _fmt(None) == "–"
    assert _fmt(0.99996, one=True) == "0.99996" and _fmt(0.99996, 3) == "1.000"   # "one": figures, not latencies
    assert _fmt(float("nan")) == "nan"


def _tiny_page() -> str:
    a = _cls(0, {0: 0.6, 1: 0.4})
    cmp = compare(a, _cls(0, {0: 0.5999996, 1: 0.4000004}))
    s = ShadowSummary()
    res = {"latency_ms": 0.0004, "prediction": "0", "class_id": 0}
    s.add({"index": 0, "id": "x", "agree": True, "truth": None, "compare": cmp,
           "a": {"ok": True, "result": res}, "b": {"ok": True, "result": res}})
    meta = {"model": "m", "version": "1", "target": "t", "device": "d", "manifest_sha256": "0" * 64, "path": "p"}
    return render(s.to_dict(), (list(s.latencies_a), list(s.latencies_b)), dict(s.figures),
                  {"a": meta, "b": meta, "input": "i", "cpu": "c"})


def test_the_report_shows_a_tiny_latency_and_a_tiny_score_diff(tmp_path):
    page = _tiny_page()
    assert "<b>0.0004 / 0.0004 ms</b>" in page and "p99 0.0004 / 0.0004 ms" in page      # was 0.000 / 0.000
    assert "score diff 4e-07" in page and "score diff 0.0000" not in page
    assert '<td class="num">0.0004 / 0.0004</td>' in page
    from test_shadow_report_browser import chromium          # skips without the browser

    html = tmp_path / "tiny.html"
    html.write_text(page)
    proc = chromium(tmp_path, "--dump-dom", html.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "0.0004 / 0.0004 ms" in proc.stdout and "score diff 4e-07" in proc.stdout


# -- 3. probe files: the bytes hashed are the bytes parsed ---------------------------------------------
def _swapped_inputs(art) -> bytes:
    """A valid probe inputs file of the same samples in reverse order (parses, and differs)."""
    raws = probe_mod._decode_inputs(probe_mod._load_npz((art / probe_mod.INPUTS).read_bytes()))
    arrays: dict = {}
    for i, raw in enumerate(reversed(raws)):
        arrays.update(probe_mod._encode_input(i, raw))
    return probe_mod._npz(arrays)


def test_a_probe_file_changed_after_the_load_hashed_it_is_refused(make_artifact):
    import edge_runtime as er

    art = make_artifact("image-classification", probe=4)
    with er.load(art, warmup=False) as rt:           # every file hashed, the probe files included
        (art / probe_mod.INPUTS).write_bytes(_swapped_inputs(art))
        with pytest.raises(ArtifactError) as exc:
            verify.verify_runtime(rt)                # read them again, unverified: ran the swapped samples
    assert exc.value.code == "artifact_hash_mismatch" and exc.value.details.get("file") == probe_mod.INPUTS


class _ChangesTheFileOnceHashed:
    """A sha256 whose ``hexdigest`` of the probe inputs file (its hash done) rewrites that file, once:
    it changes on disk at the very moment after its hash, the worst time for a second read."""

    armed: list = []        # [(the file's sha256, what rewrites it)]

    def __init__(self, real):
        self._h = real

    def update(self, data) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        digest = self._h.hexdigest()
        if self.armed and digest == self.armed[0][0]:
            self.armed.pop()[1]()
        return digest


def test_the_probe_bytes_parsed_are_the_bytes_hashed(make_artifact, monkeypatch):
    art = make_artifact("image-classification", probe=4)
    from edge_runtime.artifact import load_artifact
    from edge_runtime.probe import read

    original = read(load_artifact(art, verify=True)).inputs
    swapped = _swapped_inputs(art)
    assert probe_mod._decode_inputs(probe_mod._load_npz(swapped)) != original

    def change():
        (art / probe_mod.INPUTS).write_bytes(swapped)

    real_new, real_sha256 = hashlib.new, hashlib.sha256
    monkeypatch.setattr(hashlib, "new", lambda *a, **k: _ChangesTheFileOnceHashed(real_new(*a, **k)))
    monkeypatch.setattr(hashlib, "sha256", lambda *a, **k: _ChangesTheFileOnceHashed(real_sha256(*a, **k)))
    sha = json.loads((art / "manifest.json").read_text())["files"][probe_mod.INPUTS]["sha256"]
    _ChangesTheFileOnceHashed.armed[:] = [(sha, change)]
    # ``verify --all`` with a chosen path that did not load reads the probe set without a runtime
    _, _, _, _, probe = verify._chosen_failed(art, "auto", None, DeviceError("no device", code="device_load_failed"))
    assert not _ChangesTheFileOnceHashed.armed                 # the file did change right after its hash
    assert probe.inputs == original                          # what was hashed, never the file read again
    assert (art / probe_mod.INPUTS).read_bytes() == swapped
