"""The image input shared by the vision tasks (object detection, pose, segmentation).

One raw image (bytes, a path or a uint8 array, under the image limits) becomes
the model's input tensor and the transform back to the original pixels:

- ``resize``: ``"stretch"`` (each axis scaled to the input size) or
  ``"letterbox"`` (one scale keeps the aspect ratio; the rest is padded with
  ``pad``, 0..255, at the bottom/right for ``pad_position`` ``"top-left"``,
  YOLOX's, or evenly on both sides for ``"center"``, Ultralytics');
- ``interpolation``: ``bilinear`` (PIL's, antialiased when shrinking),
  ``nearest``, ``bicubic`` or ``bilinear-half-pixel`` (TF's ``resize_bilinear``
  with half-pixel centres, truncated: how Coral's models were evaluated);
- ``channel_order``: ``"RGB"`` or ``"BGR"`` (OpenCV-trained models); ``mean`` and
  ``std`` are in the model's channel order;
- ``scale``/``mean``/``std``/``layout``/``input``: as for image classification
  (:mod:`.image`: ``x = (p * scale - mean[c]) / std[c]``, quantized with the
  input tensor's own parameters for an integer input).

:class:`Geometry` maps model-input coordinates back to the original image:
``x_orig = (x - offset_x) / scale_x`` (and y alike), clipped to the image.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError

from .base import preprocess_error
from .image import _RESAMPLE, TensorPlan, check_image_preprocess, input_plan, resize_half_pixel
from .image_decode import _pil, bmp_bytes, decode

RESIZE_MODES = ("stretch", "letterbox")
PAD_POSITIONS = ("top-left", "center")
INTERPOLATIONS = tuple(_RESAMPLE) + ("bilinear-half-pixel",)
CHANNEL_ORDERS = ("RGB", "BGR")
VISION_PRE_KEYS = ("size", "channels", "scale", "mean", "std", "layout", "input", "resize", "interpolation",
                   "pad", "pad_position", "channel_order")


@dataclass(frozen=True)
class Geometry:
    """How an original ``width`` x ``height`` image sits in the model input."""

    width: int
    height: int
    scale_x: float
    scale_y: float
    offset_x: float = 0.0
    offset_y: float = 0.0

    def to_original(self, boxes: np.ndarray) -> np.ndarray:
        """``[N, 4]`` x1, y1, x2, y2 in model-input pixels → original pixels, clipped to the image."""
        b = np.asarray(boxes, dtype=np.float32).reshape(-1, 4).copy()
        b[:, 0::2] = np.clip((b[:, 0::2] - self.offset_x) / self.scale_x, 0, self.width)
        b[:, 1::2] = np.clip((b[:, 1::2] - self.offset_y) / self.scale_y, 0, self.height)
        return b

    def points_to_original(self, xy: np.ndarray) -> np.ndarray:
        """``[N, 2]`` x, y in model-input pixels → original pixels, clipped to the image."""
        p = np.asarray(xy, dtype=np.float32).reshape(-1, 2).copy()
        p[:, 0] = np.clip((p[:, 0] - self.offset_x) / self.scale_x, 0, self.width)
        p[:, 1] = np.clip((p[:, 1] - self.offset_y) / self.scale_y, 0, self.height)
        return p

    def content(self) -> tuple[int, int, int, int]:
        """``(x0, y0, x1, y1)``: the model-input pixels the image covers (the rest is padding)."""
        x0, y0 = int(round(self.offset_x)), int(round(self.offset_y))
        return (x0, y0, x0 + int(round(self.width * self.scale_x)), y0 + int(round(self.height * self.scale_y)))


def check_vision_preprocess(pre: dict, task: str) -> None:
    """Type-check the vision ``--preprocess`` keys (``preprocess_error`` on a bad one)."""
    def bad(key, want):
        preprocess_error(f"--preprocess {key!r}: {want}, got {pre[key]!r}")

    check_image_preprocess(pre, task, bad)
    choices = {"layout": ("NCHW", "NHWC"), "resize": RESIZE_MODES, "interpolation": INTERPOLATIONS,
               "pad_position": PAD_POSITIONS, "channel_order": CHANNEL_ORDERS}
    for key, allowed in choices.items():
        if key in pre and pre[key] not in allowed:
            bad(key, f"need one of {', '.join(allowed)}")
    if "pad" in pre and not (isinstance(pre["pad"], int) and not isinstance(pre["pad"], bool)
                             and 0 <= pre["pad"] <= 255):
        bad("pad", "need an integer 0..255")
    if "input" in pre and not isinstance(pre["input"], str):
        bad("input", "need a string")


class VisionInput:
    """The pre-processing of one vision artifact: raw image → ``(tensor, Geometry)``."""

    def __init__(self, pre: dict, spec: dict):
        if "size" not in pre:
            raise ArtifactError("image preprocess needs 'size'", file="manifest.json", code=ec.MANIFEST_FIELD_MISSING)
        self.pre = pre
        self.spec = spec
        self.height, self.width = (int(v) for v in pre["size"])
        channels = int(pre.get("channels", 3))
        mode = {1: "L", 3: "RGB"}.get(channels)
        if mode is None:
            raise ArtifactError(f"unsupported channel count {channels}", file="manifest.json",
                                code=ec.MANIFEST_FIELD_INVALID)
        self.mode: str = mode
        shape = [int(d) for d in spec.get("shape") or []]
        if len(shape) == 4 and [self.height, self.width, channels] not in (shape[1:], [shape[2], shape[3], shape[1]]):
            # every vision task checks it here, at load: segmentation and pose failed at the first call (a
            # feed of another shape, inference_failed) where detection already refused the artifact
            raise ArtifactError(f"preprocess size {[self.height, self.width]} x {channels} channel(s) is not the model "
                                f"input's shape {shape}", file="manifest.json", code=ec.MANIFEST_FIELD_INVALID)
        self.resize = pre.get("resize", "stretch")
        self.interpolation = pre.get("interpolation", "bilinear")
        if self.resize not in RESIZE_MODES or self.interpolation not in INTERPOLATIONS:
            raise ArtifactError(f"unsupported resize {self.resize!r} / interpolation {self.interpolation!r}",
                                file="manifest.json", code=ec.MANIFEST_FIELD_INVALID)
        self.pad = int(pre.get("pad", 0))
        self.center = pre.get("pad_position", "top-left") == "center"
        self.bgr = pre.get("channel_order", "RGB") == "BGR" and channels == 3
        # the tensor step sees a canvas of exactly the input size (no resize left to do), as an
        # array: "bilinear-half-pixel" is the one resize to_tensor takes arrays for, a no-op here
        self._tensor_pre = {k: v for k, v in pre.items() if k not in ("resize", "interpolation")}
        self._tensor_pre["resize"] = "bilinear-half-pixel"
        self.plan = input_plan(self._tensor_pre, spec, channels)
        self.tensorize = TensorPlan(self._tensor_pre, spec, channels, self.plan)    # built once, not per call
        want = [channels, self.height, self.width] if self.tensorize.nchw else [self.height, self.width, channels]
        if len(shape) == 4 and shape[1:] != want:
            # the size check above takes either layout: a layout unlike the model's loaded, warned at warm-up and
            # failed every call (inference_failed: a feed of another shape)
            raise ArtifactError(f"preprocess layout {'NCHW' if self.tensorize.nchw else 'NHWC'} feeds the model "
                                f"{[1, *want]}, its input is {shape}: the manifest's layout is not the model's",
                                file="manifest.json", code=ec.MANIFEST_FIELD_INVALID)
        _pil()

    def geometry(self, w0: int, h0: int) -> Geometry:
        if self.resize == "stretch":
            return Geometry(w0, h0, self.width / w0, self.height / h0)
        r = min(self.width / w0, self.height / h0)
        nw, nh = max(1, int(round(w0 * r))), max(1, int(round(h0 * r)))
        ox, oy = ((self.width - nw) // 2, (self.height - nh) // 2) if self.center else (0, 0)
        return Geometry(w0, h0, nw / w0, nh / h0, float(ox), float(oy))

    def pixels(self, img, geo: Geometry) -> np.ndarray:
        """The model-input canvas, HxWxC uint8, in the model's channel order."""
        x0, y0, x1, y1 = geo.content()
        nw, nh = x1 - x0, y1 - y0
        if self.interpolation == "bilinear-half-pixel":
            a = np.asarray(img)
            a = a[:, :, None] if a.ndim == 2 else a
            if a.shape[:2] != (nh, nw):
                r = resize_half_pixel(a, nh, nw)
                np.clip(r, 0, 255, out=r)
                a = np.floor(r).astype(np.uint8)
        else:
            if img.size != (nw, nh):
                img = img.resize((nw, nh), resample=_RESAMPLE[self.interpolation])
            a = np.asarray(img)
            a = a[:, :, None] if a.ndim == 2 else a
        if (nw, nh) != (self.width, self.height):
            canvas = np.full((self.height, self.width, a.shape[2]), self.pad, dtype=np.uint8)
            canvas[y0:y1, x0:x1] = a
            a = canvas
        if self.bgr:
            a = a[:, :, ::-1]
        return np.ascontiguousarray(a)

    def prepare(self, raw, limits) -> tuple[np.ndarray, Geometry, int]:
        """``(input tensor, geometry, decoded pixel count)``; every bad input an ``InputError``."""
        img = decode(raw, limits, self.mode)
        w0, h0 = img.size
        geo = self.geometry(w0, h0)
        return self.tensorize(self.pixels(img, geo)), geo, w0 * h0

    def warmup_sample(self) -> bytes:
        return bmp_bytes(self.width, self.height, (self.pad,) * 3)


def vision_import_preprocess(spec: dict, options: dict, warnings: list, *, resize: str = "stretch") -> dict:
    """The ``preprocess`` section of an imported vision model: the image-import section
    (:func:`.image_import.image_preprocess`: size, layout, normalisation checked against the
    input quantization) with its interpolation under ``interpolation`` and ``resize`` the
    stretch/letterbox mode (``options`` may state ``resize_mode``, ``pad``, ``pad_position``,
    ``channel_order``)."""
    from .image_import import image_preprocess

    opts = dict(options)
    mode = opts.pop("resize_mode", None) or resize
    extra = {k: opts.pop(k) for k in ("pad", "pad_position", "channel_order") if k in opts}
    pre = image_preprocess(spec, warnings=warnings, **opts)
    pre["interpolation"] = pre.pop("resize")
    pre["resize"] = mode
    pre.update(extra)
    if mode not in RESIZE_MODES:
        preprocess_error(f"resize mode {mode!r}: need one of {', '.join(RESIZE_MODES)}")
    return pre
