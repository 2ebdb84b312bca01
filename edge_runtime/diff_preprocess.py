"""How two inference versions of a vision task (detection, pose, segmentation) read their image
preprocess: ``stated_defaults``, which ``edge-infer diff`` compares the manifests through, so that a
key one side states at the value the other side's default reads alike is no difference.

``edge-infer import ... --channel-order RGB`` writes ``channel_order`` where an import without the
flag leaves it out; both run the same pixels through the same model, and ``diff`` read "different: 1
prediction", exit 1. The reading is the task's own (``models.vision.VisionInput``), never a copy of
its defaults; a stated value the other side's default does not read alike stays a difference."""

from __future__ import annotations

from typing import Mapping

KEYS = ("channels", "resize", "interpolation", "pad", "pad_position", "channel_order")


def _reading(man: Mapping) -> tuple | None:
    """``KEYS`` as the vision task reads ``man``'s preprocess; None for another task or one that does not load."""
    try:
        from edge_runtime.models import get_task
        from edge_runtime.models.vision import VisionInput
        from edge_runtime.models.vision_task import VisionTask

        if not issubclass(get_task(man["task"]), VisionTask):
            return None
        v = VisionInput(dict(man["preprocess"]), dict(man["variants"][0]["buckets"][0]["inputs"][0]))
    except Exception:       # noqa: BLE001 - compared leaf by leaf as written, as before
        return None
    letterbox = v.resize != "stretch"       # a stretch fills the input: no padding, so no pad value or position
    return v.mode, v.resize, v.interpolation, v.pad if letterbox else None, v.center if letterbox else None, v.bgr


def stated_defaults(a: Mapping, b: Mapping) -> tuple[Mapping, Mapping]:
    """``a`` and ``b`` (manifests) less each preprocess key in ``KEYS`` written differently (stated on one
    side only, or two values) where both read it alike (a ``pad`` under ``stretch`` reads as none); unchanged
    for any other task."""
    ra, rb = _reading(a), _reading(b)
    if ra is None or rb is None:
        return a, b
    pa, pb = a["preprocess"], b["preprocess"]
    drop = {k for k, x, y in zip(KEYS, ra, rb) if pa.get(k, KEYS) != pb.get(k, KEYS) and x == y}
    if not drop:
        return a, b
    return ({**a, "preprocess": {k: v for k, v in pa.items() if k not in drop}},
            {**b, "preprocess": {k: v for k, v in pb.items() if k not in drop}})
