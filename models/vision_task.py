"""The declarations and members the vision tasks share (object detection, pose, segmentation).

An image in (``input_kind`` "image": bytes, a path or a uint8 array, under the image
limits) through :class:`~.vision.VisionInput`; samples are an image folder or a ``.npy``
of uint8 images; ``--preprocess`` takes the vision keys (``check_vision_preprocess``);
import takes the vision options (:func:`~.vision.vision_import_preprocess`).
"""

from __future__ import annotations

import os
from pathlib import Path

from edge_runtime import error_codes as ec
from edge_runtime.errors import InputError
from edge_runtime.limits import IMAGE_LIMITS

from .base import Task
from .image import load_image_samples
from .vision import VISION_PRE_KEYS, VisionInput, check_vision_preprocess

VISION_IMPORT_OPTIONS = ("resize", "scale", "mean", "std", "resize_mode", "pad", "pad_position", "channel_order")


class VisionTask(Task):
    input_kind = "image"
    score_field = "image"
    length_unit = "pixels"
    needs_preprocess = True
    default_limits = IMAGE_LIMITS
    preprocess_keys = VISION_PRE_KEYS
    load_samples = staticmethod(load_image_samples)
    vision: VisionInput            # set by the task's __init__

    @classmethod
    def check_sample_path(cls, path, what: str) -> None:
        p = Path(path)
        if not p.is_dir() and p.suffix.lower() != ".npy":
            raise InputError(f"{what} {p}: {cls.name} takes a folder of PNG/JPEG/BMP images or a .npy of uint8 "
                             f"images", code=ec.CONVERT_CALIBRATION_INVALID)

    @classmethod
    def check_preprocess_values(cls, pre: dict) -> None:
        check_vision_preprocess(pre, cls.name)

    def warmup_sample(self):
        return self.vision.warmup_sample()

    def request_bytes(self, raw) -> int:
        if isinstance(raw, (str, os.PathLike)):
            return 0  # a path: the file's size is checked against max_image_bytes
        return super().request_bytes(raw)
