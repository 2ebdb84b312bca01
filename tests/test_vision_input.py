"""models/vision.py: the image input the vision tasks (#18) share: letterbox/stretch geometry,
pad, channel order, and the way back to original pixels."""

from __future__ import annotations

import numpy as np
import pytest

from edge_runtime.errors import InputError
from edge_runtime.limits import DEFAULT_LIMITS
from edge_runtime.models.vision import VisionInput, check_vision_preprocess

SPEC = {"name": "images", "dtype": "float32", "shape": [1, 3, 16, 16]}


def _pre(**kw):
    return {"size": [16, 16], "scale": 1.0, "layout": "NCHW", **kw}


def test_letterbox_top_left_pads_bottom_right_and_maps_boxes_back():
    v = VisionInput(_pre(resize="letterbox", pad=114), SPEC)
    img = np.full((8, 32, 3), 10, dtype=np.uint8)                   # 32 wide, 8 high -> scale 0.5, 16x4
    x, geo, n = v.prepare(img, DEFAULT_LIMITS)
    assert x.shape == (1, 3, 16, 16) and n == 256
    assert geo.scale_x == geo.scale_y == 0.5 and (geo.offset_x, geo.offset_y) == (0, 0)
    assert np.all(x[0, :, :4, :] == 10) and np.all(x[0, :, 4:, :] == 114)
    back = geo.to_original(np.array([[0, 0, 16, 4], [2, 1, 8, 3]]))
    np.testing.assert_allclose(back, [[0, 0, 32, 8], [4, 2, 16, 6]])
    np.testing.assert_allclose(geo.to_original(np.array([[-5, -5, 99, 99]])), [[0, 0, 32, 8]])   # clipped


def test_letterbox_center_and_bgr():
    v = VisionInput(_pre(resize="letterbox", pad=0, pad_position="center", channel_order="BGR"), SPEC)
    img = np.zeros((8, 32, 3), dtype=np.uint8)
    img[..., 0] = 200                                               # red
    x, geo, _ = v.prepare(img, DEFAULT_LIMITS)
    assert geo.offset_y == 6 and geo.offset_x == 0
    assert np.all(x[0, 2, 6:10] == 200) and np.all(x[0, 0, 6:10] == 0)   # red is the last channel in BGR
    assert np.all(x[0, :, :6] == 0)
    np.testing.assert_allclose(geo.to_original(np.array([[0, 6, 16, 10]])), [[0, 0, 32, 8]])


def test_stretch_scales_each_axis():
    v = VisionInput(_pre(resize="stretch"), SPEC)
    _, geo, _ = v.prepare(np.zeros((8, 32, 3), dtype=np.uint8), DEFAULT_LIMITS)
    assert (geo.scale_x, geo.scale_y) == (0.5, 2.0)
    np.testing.assert_allclose(geo.points_to_original(np.array([[8, 8]])), [[16, 4]])


def test_bad_inputs_and_bad_preprocess_are_typed():
    v = VisionInput(_pre(resize="letterbox"), SPEC)
    for bad in (None, 3.5, b"", b"not an image", np.zeros((4, 4), dtype=np.float32)):
        with pytest.raises(InputError):
            v.prepare(bad, DEFAULT_LIMITS)
    for pre in ({"size": [16, 16], "resize": "squash"}, {"size": [16, 16], "pad": 300},
                {"size": [16, 16], "channel_order": "GBR"}, {"resize": "letterbox"}):
        with pytest.raises(InputError) as ei:
            check_vision_preprocess(pre, "object-detection")
        assert ei.value.code == "convert_preprocess_invalid"
    assert v.prepare(v.warmup_sample(), DEFAULT_LIMITS)[0].shape == (1, 3, 16, 16)
