"""Vision results drawn onto their image: what ``edge-infer infer --draw OUT.png`` writes.

``draw(image, result, out_path=None) -> PIL.Image``: ``image`` is a path, bytes,
a uint8 array or a PIL image (decoded as the tasks decode it, so result pixels
land where the model saw them: a PIL image too is turned upright by its EXIF
orientation and has 16-bit samples scaled); ``result`` an :class:`InferenceResult`
or its ``to_dict()``. Tag text grows with the image, as the line width does.

- detections: a box per detection in its class's colour (``class_color``: a
  fixed palette indexed by ``class_id``) and a filled tag ``"person 0.92"``
  above the box (inside it at the top edge); line width grows with the image;
- keypoints: a dot per keypoint scoring at least ``keypoint_threshold``
  (``keypoint_color``: face, left, right) and skeleton lines between confident
  pairs (``edge_runtime.models.pose_estimation.SKELETON``, else COCO's);
- segmentation (``outputs["mask"]``): each class blended in at ``alpha``
  (the background class, 0 unless the artifact says otherwise, left as it is) and a legend of the classes present
  with their pixel share; a mask of another size than the image is refused
  (``ValueError``: it is another image's result), never stretched;
- anything else: the prediction and its score in a tag at the top left.

``summarize(d)`` replaces a mask's pixel list in a result dict by its shape and
per-class counts (the CLI's ``--json`` and ``score``'s lines). Pillow is
imported by the functions that draw, never at import.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

# a fixed palette (Ultralytics'), indexed by class id
PALETTE = [(255, 56, 56), (255, 157, 151), (255, 112, 31), (255, 178, 29), (207, 210, 49), (72, 249, 10),
           (146, 204, 23), (61, 219, 134), (26, 147, 52), (0, 212, 187), (44, 153, 168), (0, 194, 255),
           (52, 69, 147), (100, 115, 255), (0, 24, 236), (132, 56, 255), (82, 0, 133), (203, 56, 255),
           (255, 149, 200), (255, 55, 199)]
KEYPOINT_COLORS = {"face": (51, 153, 255), "left": (0, 220, 0), "right": (255, 128, 0)}
# COCO's 17-keypoint skeleton, 0-based (the fallback when the pose task exports none)
COCO_SKELETON = [(15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8),
                 (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6)]
KEYPOINT_THRESHOLD = 0.2
FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".bmp": "BMP"}


def class_color(class_id: int) -> tuple[int, int, int]:
    return PALETTE[int(class_id) % len(PALETTE)]


def keypoint_color(index: int) -> tuple[int, int, int]:
    """COCO order: 0-4 the face, then left (odd) and right (even) alternate."""
    return KEYPOINT_COLORS["face" if index < 5 else "left" if index % 2 else "right"]


def skeleton() -> list[tuple[int, int]]:
    try:
        from .models.pose_estimation import SKELETON

        return [(int(a), int(b)) for a, b in SKELETON]
    except (ImportError, AttributeError, TypeError, ValueError):
        return list(COCO_SKELETON)


def output_format(out_path) -> str:
    """The Pillow format ``out_path``'s suffix names (``ValueError`` for another suffix)."""
    fmt = FORMATS.get(Path(out_path).suffix.lower())
    if fmt is None:
        raise ValueError(f"{out_path}: cannot tell the image format from its suffix (use {', '.join(FORMATS)})")
    return fmt


def check_out_path(out_path) -> None:
    """Refuse (``ValueError``) a path ``save`` could not write, before any work is done."""
    p = Path(out_path)
    if p.is_dir():
        raise ValueError(f"{out_path} is a folder")
    output_format(out_path)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"cannot write {out_path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"cannot write {out_path}: permission denied")


def save(img, out_path) -> Path:
    """``img`` to ``out_path`` atomically (a temporary file, then a rename): never half-written."""
    out = Path(out_path)
    fmt = output_format(out)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        img.save(tmp, format=fmt)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def _as_dict(result) -> tuple[dict, np.ndarray | None]:
    """(the result's dict without a mask, the mask as a uint8 array or None)."""
    if isinstance(result, dict):
        d = dict(result)
        m = (d.get("outputs") or {}).get("mask")
        if isinstance(m, dict):
            if "data" not in m:
                raise ValueError("the result holds a mask summary, not the mask: draw from the InferenceResult")
            m = np.asarray(m["data"], dtype=np.uint8).reshape(m.get("shape") or np.shape(m["data"]))
    else:
        m = (result.outputs or {}).get("mask")
        d = {k: getattr(result, k, None) for k in ("prediction", "scores", "top_k", "detections", "keypoints")}
    return d, None if m is None else np.asarray(m).astype(np.uint8, copy=False)


def class_names(d: dict, ids) -> dict[int, str]:
    """Label of each class id of a mask: from ``top_k``, else the ``scores`` entry whose pixel
    share matches, else ``"class N"``."""
    names = {int(t["index"]): str(t["label"]) for t in d.get("top_k") or () if "index" in t}
    return {int(i): names.get(int(i), f"class {int(i)}") for i in ids}


def mask_classes(d: dict, mask: np.ndarray) -> list[dict]:
    """``[{"class_id", "label", "pixels", "share"}]`` of the classes present, by class id."""
    ids, counts = np.unique(mask, return_counts=True)
    total = max(int(mask.size), 1)
    names = class_names(d, ids)
    free = dict((d.get("scores") or {}).items())
    out = []
    for i, n in zip(ids.tolist(), counts.tolist()):
        label = names[i]
        if label.startswith("class "):          # no index given: the scores entry with this share
            # the nearest share, not the first within the tolerance: on a 4-MP mask two classes 1 pixel
            # apart differ by 2.5e-7, and the first-listed (the larger) one's label went to the other
            near = [(abs(float(v) - n / total), j, k) for j, (k, v) in enumerate(free.items())
                    if abs(float(v) - n / total) < 1e-6]
            hit = min(near)[2] if near else None
            if hit is not None:
                free.pop(hit)
                label = str(hit)
        out.append({"class_id": int(i), "label": label, "pixels": int(n), "share": n / total})
    return out


def summarize(d: dict) -> dict:
    """``d`` (a result dict) with ``outputs["mask"]`` as ``{"dtype", "shape", "classes"}``
    (:func:`mask_classes`) instead of every pixel; other results unchanged."""
    outs = d.get("outputs")
    if not isinstance(outs, dict):
        return d
    mask = outs.get("mask")
    if not isinstance(mask, dict) or "data" not in mask:
        return d
    arr = np.asarray(mask["data"], dtype=np.uint8)
    summary = {"dtype": mask.get("dtype"), "shape": list(arr.shape), "classes": mask_classes(d, arr)}
    return {**d, "outputs": {**outs, "mask": summary}}


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError, ImportError):       # no FreeType: the bitmap font
        return ImageFont.load_default()


def _tag(dr, font, text: str, x: float, y: float, color, size: tuple[int, int], below: bool = False) -> int:
    """A filled tag with ``text`` whose bottom-left is (x, y) (top-left when ``below``, or when it would
    leave the image at the top), kept inside the image; returns its height."""
    left, top, right, bottom = dr.textbbox((0, 0), text, font=font)
    pad = max(1, (bottom - top) // 5)
    w, h = right - left + 2 * pad, bottom - top + 2 * pad
    x0 = int(min(max(x, 0), max(size[0] - w, 0)))
    y0 = int(y) if below or y - h < 0 else int(y) - h
    y0 = min(max(y0, 0), max(size[1] - h, 0))
    dr.rectangle([x0, y0, x0 + w - 1, y0 + h - 1], fill=color)
    ink = (0, 0, 0) if 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2] > 150 else (255, 255, 255)
    dr.text((x0 + pad - left, y0 + pad - top), text, fill=ink, font=font)
    return h


def _box(b, size: tuple[int, int]) -> tuple[int, int, int, int]:
    w, h = size
    x1, y1 = (min(max(int(round(float(v))), 0), m - 1) for v, m in ((b[0], w), (b[1], h)))
    x2, y2 = (min(max(int(round(float(v))) - 1, 0), m - 1) for v, m in ((b[2], w), (b[3], h)))
    return x1, y1, max(x2, x1), max(y2, y1)


def _overlay(img, mask: np.ndarray, alpha: float, background: int | None = 0):
    from PIL import Image

    if mask.shape != (img.height, img.width):     # the task's mask is at the image's own size
        raise ValueError(f"the mask is {mask.shape[1]}x{mask.shape[0]} but the image {img.width}x{img.height}: "
                         "the result is not this image's (stretching the mask would draw it misaligned)")
    colors = np.array([class_color(i) for i in range(len(PALETTE))], dtype=np.float32)
    px = np.asarray(img, dtype=np.float32).copy()
    fg = mask != background if background is not None else np.ones(mask.shape, bool)
    px[fg] = (1 - alpha) * px[fg] + alpha * colors[mask[fg] % len(PALETTE)]
    return Image.fromarray(np.clip(np.rint(px), 0, 255).astype(np.uint8), "RGB")


def _upright(img):
    """A PIL image as the tasks decode an image file: EXIF orientation applied (a phone photo's
    boxes are in upright pixels), 16-bit samples scaled to 8 bits (not clipped to white), RGB."""
    from .models.image_decode import _orientation, to_8bit

    turn = _orientation(img)
    img = to_8bit(img).convert("RGB")
    return img if turn is None else img.transpose(turn)


def draw(image, result, out_path=None, *, keypoint_threshold: float = KEYPOINT_THRESHOLD, alpha: float = 0.5,
         legend: bool = True, limits=None, background: int | None = 0) -> Any:
    """``result`` drawn onto ``image`` (see the module doc); saved to ``out_path`` when given
    (its suffix picks the format: .png, .jpg, .jpeg, .bmp). ``background``: a segmentation mask's class
    left undrawn and out of the legend (the artifact's ``postprocess.background``: ``rt.task.background``;
    None: every class is drawn)."""
    from PIL import Image, ImageDraw

    from .limits import DEFAULT_LIMITS
    from .models.image_decode import decode

    if out_path is not None:
        output_format(out_path)
    d, mask = _as_dict(result)
    img = _upright(image) if isinstance(image, Image.Image) else decode(image, limits or DEFAULT_LIMITS, "RGB")
    size = img.size
    lw = max(2, round(max(size) / 300))
    # the text grows with the image as the lines do: a fixed cap left a 4000-pixel photo's tags a few
    # pixels high once the picture is seen whole
    font = _font(max(10, round(max(size) / 45)))
    if mask is not None:
        img = _overlay(img, mask, alpha, background)
    dr = ImageDraw.Draw(img)
    dets = d.get("detections") or []
    for det in dets:
        dr.rectangle(_box(det["box"], size), outline=class_color(det.get("class_id", 0)), width=lw)
    kps = d.get("keypoints") or []
    ok = [float(k.get("score", 1.0)) >= keypoint_threshold for k in kps]
    for a, b in skeleton():
        if a < len(kps) and b < len(kps) and ok[a] and ok[b]:
            side = {keypoint_color(a), keypoint_color(b)}
            dr.line([(float(kps[a]["x"]), float(kps[a]["y"])), (float(kps[b]["x"]), float(kps[b]["y"]))],
                    fill=side.pop() if len(side) == 1 else KEYPOINT_COLORS["face"], width=lw)
    r = lw + 2
    for i, k in enumerate(kps):
        if ok[i]:
            x, y = float(k["x"]), float(k["y"])
            dr.ellipse([x - r, y - r, x + r, y + r], fill=keypoint_color(i))
    for det in reversed(dets):         # best last: where tags overlap, the most confident one is read
        x1, y1, _, _ = _box(det["box"], size)
        _tag(dr, font, f"{det.get('label', det.get('class_id'))} {float(det['score']):.2f}", x1, y1,
             class_color(det.get("class_id", 0)), size)
    if mask is not None and legend:
        y = 0
        for c in (c for c in mask_classes(d, mask) if c["class_id"] != background):
            y += _tag(dr, font, f"{c['label']} {100 * c['share']:.1f}%", 0, y, class_color(c["class_id"]), size,
                      below=True)
    if mask is None and not dets and not kps and d.get("prediction") is not None:
        score = next(iter((d.get("scores") or {}).values()), None)
        _tag(dr, font, f"{d['prediction']}" + ("" if score is None else f" {float(score):.2f}"), 0, 0,
             PALETTE[0], size, below=True)
    if out_path is not None:
        save(img, out_path)
    return img
