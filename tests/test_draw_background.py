"""``draw`` leaves the artifact's background class undrawn, not class 0 always.

A segmenter whose ``postprocess.background`` is 3 (class 0 a real class: "road") had its road
blended over and its background painted, with the background's share in the legend:
``edge-infer infer --draw`` showed the reverse of what the model said is foreground.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from edge_runtime.draw import class_color, draw
from factories import rewrite_manifest
from test_draw import plain, px, seg_result


def test_the_stated_background_is_left_as_it_is_and_class_0_is_drawn():
    img = plain()
    mask = np.full((160, 200), 3, np.uint8)
    mask[40:120, 60:160] = 0
    result = seg_result(mask, labels=("road", "cat", "dog", "background"))
    out = px(draw(img, result, legend=False, background=3))
    assert (out[mask == 3] == img[mask == 3]).all()
    want = np.rint(0.5 * img[mask == 0] + 0.5 * np.array(class_color(0)))
    assert np.abs(out[mask == 0] - want).max() <= 1
    everything = px(draw(img, result, legend=False, background=None))
    assert (everything != img).any(axis=-1).all()      # no background: every class is drawn


def test_infer_draw_reads_the_artifacts_background(make_artifact, tmp_path):
    art = make_artifact("semantic-segmentation")
    rewrite_manifest(art, lambda m: m["postprocess"].update(background=2))
    from PIL import Image

    Image.fromarray(np.full((160, 200, 3), 90, np.uint8)).save(tmp_path / "in.png")
    out = tmp_path / "drawn.png"
    run = subprocess.run([sys.executable, "-m", "edge_runtime", "infer", str(art), "--image", str(tmp_path / "in.png"),
                          "--device", "fake", "--draw", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    import edge_runtime as er

    with er.load(art, device="fake", warmup=False) as rt:      # the same answer, in-process: the fake model
        m = rt.infer(str(tmp_path / "in.png")).outputs["mask"]      # is deterministic
    assert (m == 2).any() and (m != 2).any(), np.unique(m)
    drawn = np.asarray(Image.open(out).convert("RGB"))[60:]    # below the legend's tags
    m = m[60:]
    assert (drawn[m == 2] == 90).all()                          # the stated background: as it was
    assert (drawn[m != 2] != 90).any(axis=-1).all()             # class 0 and 1: drawn
