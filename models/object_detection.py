"""object-detection: image → letterbox/stretch → detector → family decode → class-wise NMS → boxes.

Each detection is ``{"label", "class_id", "score", "box": [x1, y1, x2, y2]}`` in
original-image pixels, best first. The manifest's ``postprocess`` holds the
decode family and its parameters (:mod:`.detection_decode`; resolved against
the outputs at import, at convert and again at load: a model whose outputs do
not fit is an ``ArtifactError`` naming the tensor, never a crash inside
decode), the labels file and the thresholds ``score_threshold``,
``iou_threshold`` and ``max_detections``, which a call may override
(``rt.infer(image, options={...})``, within the ``max_detections`` limit).

Parity (``detection_f1``): candidate detections matched to the reference's by
class at IoU ≥ 0.5, greedily by score; F1 over all samples, with the mean IoU
of the matches.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError

from .base import SCORE_SLACK, Prepared, TaskMismatch, TaskOutput, dequantize, is_number
from .classification import score_keys
from .detection_decode import FAMILIES, nms
from .detection_head import ACTIVATION_KEYS, activation_mismatch, head_mismatch, score_kind
from .detection_parity import SCORE_MARGIN
from .detection_parity import detection_parity as detection_parity     # this task's metric, named here too
from .vision_task import VISION_IMPORT_OPTIONS, VisionTask
from .vision import VisionInput, vision_import_preprocess

THRESHOLDS = {"score_threshold": 0.25, "iou_threshold": 0.45, "max_detections": 100}
MAX_CANDIDATES = 4096           # the best-scoring boxes NMS sees (a 640 YOLO has 8400 anchors)
NEAR_MAX = 50
# how each family's reference code feeds its input, the import default: (resize, options). The
# normalisation is the family's (``normalisation_source`` "family NAME") for every input dtype, an
# integer input quantizing it with its own scale/zero point, as the reference code does; a stated
# --scale/--mean/--std replaces it. (PIL's bilinear, antialiased when shrinking: a 1080-pixel
# photo into 300 pixels keeps its detail.)
FAMILY_INPUT: dict[str, tuple[str, dict[str, Any]]] = {
    # Ultralytics (LetterBox, then RGB / 255, no mean/std); its int8 TFLite exports quantize that
    # [0, 1] input with whatever range the export's calibration left (YOLOv8n's: -2.1..2.6)
    "yolo": ("letterbox", {"resize": "bilinear", "pad": 114, "pad_position": "center",
                           "scale": "1/255", "mean": "0", "std": "1"}),
    # YOLOX (since 0.2.0): BGR pixels 0..255, not normalised (its ValTransform, legacy=False)
    "yolox": ("letterbox", {"resize": "bilinear", "pad": 114, "pad_position": "top-left",
                            "channel_order": "BGR", "scale": "1", "mean": "0", "std": "1"}),
    # NanoDet (its configs' Pipeline: keep_ratio False, normalize [[103.53, 116.28, 123.675],
    # [57.375, 57.12, 58.395]] on OpenCV's BGR pixels)
    "gfl": ("stretch", {"resize": "bilinear", "channel_order": "BGR", "scale": "1",
                        "mean": "103.53,116.28,123.675", "std": "57.375,57.12,58.395"}),
    "ssd-postprocess": ("stretch", {"resize": "bilinear"})}
NORMALISATION_KEYS = ("scale", "mean", "std")
IMAGE_DTYPES = ("uint8", "int8", "float32")


def guess_family(outputs: list[dict]) -> str | None:
    """The family whose outputs look like these, when only one does."""
    shapes = [[int(d) for d in o.get("shape", [])] for o in outputs]
    if len(outputs) == 4 and sorted(map(len, shapes)) == [1, 2, 2, 3]:
        return "ssd-postprocess"
    if len(outputs) >= 2 and len(outputs) % 2 == 0:
        return "gfl"
    if len(shapes) == 1 and len(shapes[0]) == 3:
        _, a, b = shapes[0]
        return "yolo" if a < b else None        # [1, N, 5+C] is yolox or a v5-style yolo: say which
    return None


def resolve(inputs: list[dict], outputs: list[dict], post: dict | None) -> dict:
    """The family's parameters for these tensors (``TaskMismatch`` when they do not fit)."""
    from .image_import import image_layout

    post = dict(post or {})
    if len(inputs) != 1:
        raise TaskMismatch(f"a detector takes one image input; this model has {len(inputs)}", part="inputs")
    shape = [int(d) for d in inputs[0]["shape"]]
    layout = image_layout(shape)
    if layout is None or inputs[0]["dtype"] not in IMAGE_DTYPES:
        raise TaskMismatch(f"image input {inputs[0]['name']!r} must be uint8/int8/float32 [1, H, W, 3] or "
                           f"[1, 3, H, W], got {inputs[0]['dtype']} {shape}", part="inputs")
    hw = (shape[1], shape[2]) if layout == "NHWC" else (shape[2], shape[3])
    family = post.get("family") or guess_family(outputs)
    if family is None:
        raise TaskMismatch(f"cannot tell the detector family from the outputs "
                           f"({', '.join(str(o.get('shape')) for o in outputs)}): state --family "
                           f"({', '.join(FAMILIES)})")
    if family not in FAMILIES:
        raise TaskMismatch(f"unknown detector family {family!r} (known: {', '.join(FAMILIES)})")
    params = FAMILIES[family].resolve(outputs, post, hw)
    return {"family": family, "params": params, "input_hw": hw, "classes": params.get("classes")}


def family_input(family: str | None, spec: dict, options: dict, warnings: list) -> dict:
    """The ``preprocess`` section of a ``family`` detector on the image input ``spec``: the family's
    usual input (``FAMILY_INPUT``) under the stated ``options`` (import's: ``resize`` the
    interpolation, ``resize_mode``, ``pad``, ``pad_position``, ``channel_order``, ``scale``/``mean``/
    ``std``; a stated normalisation replaces the family's as a whole). Import and convert both
    take a detector's input from here; ``normalisation_source`` says where the normalisation came
    from (``family NAME``, ``stated``, or ``default`` for a family that states none)."""
    resize, defaults = FAMILY_INPUT.get(family or "", ("stretch", {}))
    if any(k in options for k in NORMALISATION_KEYS):     # a stated normalisation replaces the family's
        defaults = {k: v for k, v in defaults.items() if k not in NORMALISATION_KEYS}
    try:
        pre = vision_import_preprocess(spec, {**defaults, **options}, warnings, resize=resize)
    except InputError as exc:
        if "scale" not in defaults or exc.code != ec.IMPORT_NORMALISATION_CLIPS:
            raise
        shown = ", ".join(f"{k} {defaults[k]}" for k in NORMALISATION_KEYS)
        raise InputError(f"{exc.message} (the {family} family's usual input, {shown}, is the default "
                         f"when no --scale/--mean/--std is stated)", code=exc.code) from None
    if "scale" in defaults and pre.get("normalisation_source") == "stated":
        pre["normalisation_source"] = f"family {family}"
    return pre


def _real(value) -> bool:
    """A real number, Python's or numpy's (``np.float32(0.5)``); never a bool (``np.bool_`` is no number)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_thresholds(values: dict, max_limit: int | None, err) -> dict:
    """``score_threshold`` 0..1, ``iou_threshold`` (0, 1], ``max_detections`` 1..limit; ``err(msg)`` raises.
    Numpy numbers count as Python's do and come back as Python ``float``/``int``."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in THRESHOLDS:
            err(f"unknown detection option {key!r} (known: {', '.join(THRESHOLDS)})")
        if key == "max_detections":
            if not (_real(value) and isinstance(value, numbers.Integral)) or value < 1:
                err(f"max_detections must be a positive integer, got {value!r}")
            if max_limit is not None and value > max_limit:
                err(f"max_detections {value} is over the limit of {max_limit} (max_detections limit)")
            out[key] = int(value)
        else:
            if not _real(value) or not (0 <= value <= 1) or (key == "iou_threshold" and value == 0):
                err(f"{key} must be a number in {'(0, 1]' if key == 'iou_threshold' else '[0, 1]'}, got {value!r}")
            out[key] = value if is_number(value) else float(value)
    return out


def unread_keys(post: dict, facts: dict) -> str | None:
    """Why ``post`` holds keys the family of ``facts`` does not read (the first one's nearest read key
    named), or None: such a key is never a silent no-op, at import nor at load."""
    import difflib

    known = {"family", "labels", *THRESHOLDS, *facts["params"],
             *(("rerun_nms",) if FAMILIES[facts["family"]].nms_in_graph else ())}
    unknown = sorted(str(k) for k in post if k not in known)
    if not unknown:
        return None
    close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
    return (f"postprocess {', '.join(map(repr, unknown))} is not read by the {facts['family']} family (it reads "
            f"{', '.join(sorted(known - {'family', 'labels'}))})" + (f"; did you mean {close[0]!r}?" if close else ""))


def _err(msg):
    raise InputError(msg, code=ec.INPUT_INVALID)


def _mismatch(msg):
    raise TaskMismatch(msg)


class ObjectDetection(VisionTask):
    name = "object-detection"
    parity_metric = "detection_f1"
    takes_labels = True
    takes_postprocess = True
    manifest_sections = {"preprocess": {"size": list}, "postprocess": {"family": str}}
    manifest_files = ("labels",)
    importable = True
    import_options = VISION_IMPORT_OPTIONS + ("family", "postprocess")
    call_options = tuple(THRESHOLDS)
    compare = staticmethod(detection_parity)

    @classmethod
    def check_io(cls, inputs, outputs, post=None) -> dict:
        return resolve(inputs, outputs, post)

    @classmethod
    def sections_for(cls, inputs, outputs, post: dict, limits: dict | None = None) -> dict:
        """The ``postprocess`` section: the stated family/parameters resolved on these tensors (``limits``:
        the artifact's, whose ``max_detections`` the stated one must not pass)."""
        from edge_runtime.limits import DEFAULT_LIMITS

        cap = (limits or {}).get("max_detections", DEFAULT_LIMITS.max_detections)
        if _real(post.get("max_detections")) and _real(cap) and post["max_detections"] > cap:
            # written as stated, every answer was cut to the limit (300 for 1000), exit 0
            raise TaskMismatch(f"postprocess max_detections {post['max_detections']} is over the artifact's "
                               f"max_detections limit of {cap}: every answer would be cut to {cap}; state at most "
                               f"{cap} (a caller may raise the limit at load and ask for more per call)")
        facts = resolve(inputs, outputs, post)
        unread = unread_keys(post, facts)
        if unread:
            # a typo ("score_treshold": 0.9) was written into the manifest and never read: the default 0.25
            # decided, exit 0. Each family reads its own keys, and the thresholds
            raise TaskMismatch(unread)
        stated = {k: v for k, v in post.items() if k not in ("family", "labels")}
        stated.update(check_thresholds({k: v for k, v in stated.items() if k in THRESHOLDS}, None, _mismatch))
        if FAMILIES[facts["family"]].nms_in_graph:
            # the graph's NMS is the model's answer; ours again only where an IoU was stated
            stated.setdefault("rerun_nms", "iou_threshold" in stated)
            if not isinstance(stated["rerun_nms"], bool):
                raise TaskMismatch(f"postprocess rerun_nms must be true or false, got {stated['rerun_nms']!r}")
        return {**THRESHOLDS, **stated, "family": facts["family"], **facts["params"]}

    @classmethod
    def build_sections(cls, request, writer, outputs):
        h, w = request.preprocess["size"]
        image = [{"name": "image", "dtype": "float32", "shape": [1, 3, int(h), int(w)]}]
        try:
            post = cls.sections_for(image, outputs, dict(getattr(request, "postprocess", None) or {}),
                                    getattr(request, "limits", None))
        except TaskMismatch as exc:
            raise InputError(f"object-detection: {exc}", code=ec.CONVERT_REQUEST_INVALID) from None
        return {"kind": "image", **request.preprocess}, cls.labels_section(request, writer, post)

    @classmethod
    def import_sections(cls, model, options, warnings):
        opts = {k: v for k, v in options.items() if v is not None}
        post = dict(opts.pop("postprocess", None) or {})
        if opts.get("family"):
            post["family"] = opts.pop("family")
        opts.pop("family", None)
        family = post.get("family") or guess_family(model["outputs"])
        pre = family_input(family, model["inputs"][0], opts, warnings)
        if "box_units" not in post and (post.get("family") or guess_family(model["outputs"])) == "yolo":
            q = (model["outputs"][0].get("quantization") or {}) if len(model["outputs"]) == 1 else {}
            if q:   # a quantized output whose range ends near 1 holds normalised boxes (Ultralytics' TFLite)
                top = (np.iinfo(np.dtype(model["outputs"][0]["dtype"])).max - q["zero_point"]) * q["scale"]
                post["box_units"] = "normalized" if top < 2.0 else "pixels"
                warnings.append(f"yolo box_units {post['box_units']!r}, read from the output quantization "
                                f"(values up to {top:.3g}); state --postprocess '{{\"box_units\": ...}}' if wrong")
            elif model.get("format") == "tflite" and len(model["outputs"]) == 1:
                # a float TFLite: Ultralytics' TFLite exports hold
                # normalised boxes whatever their dtype (its AutoBackend scales every TFLite output by the
                # input size); read as pixels, a float32 export's boxes all fell in the top-left pixel
                post["box_units"] = "normalized"
                warnings.append("yolo box_units 'normalized', as Ultralytics' TFLite exports hold them (a float "
                                "output shows no range); state --postprocess '{\"box_units\": \"pixels\"}' for a "
                                "TFLite converted with its boxes in pixels")
        sections = cls.sections_for(model["inputs"], model["outputs"], post)
        params = {k: v for k, v in sections.items() if k != "family"}
        columns = model.get("head_columns") or {}
        key = ACTIVATION_KEYS.get(sections["family"])
        if key and key not in post and score_kind(sections["family"], params, columns) == "raw":
            # logits straight from a Conv (an export without its Sigmoid): read as scores they were negative
            # or past 1 and the 0.25 threshold kept the wrong boxes, exit 0; the graph says which
            post[key] = "sigmoid"
            warnings.append(f"{sections['family']} {key} 'sigmoid': the graph writes the scores straight from a "
                            f"convolution (logits), which a sigmoid makes the scores the thresholds expect")
            sections = cls.sections_for(model["inputs"], model["outputs"], post)
            params = {k: v for k, v in sections.items() if k != "family"}
        why = (head_mismatch(sections["family"], params, columns.get(params.get("output")))
               or activation_mismatch(sections["family"], params, columns))
        if why:
            named = (f"--family {sections['family']}" if post.get("family")
                     else f"family {sections['family']} (guessed from the output shape)")
            raise InputError(f"{named}: {why}", code=ec.IMPORT_FAMILY_MISMATCH)
        return pre, sections

    def __init__(self, manifest, read_file, buckets):
        super().__init__(manifest, read_file, buckets)
        if len(buckets) != 1:
            raise ArtifactError("object detection takes exactly one bucket", file="manifest.json",
                                code=ec.MANIFEST_FIELD_INVALID)
        try:
            facts = resolve(buckets[0]["inputs"], buckets[0]["outputs"], self.post)
        except TaskMismatch as exc:
            raise ArtifactError(f"object-detection: {exc}", file="manifest.json",
                                code=ec.ARTIFACT_TASK_MISMATCH) from None
        unread = unread_keys(self.post, facts)
        if unread:
            # an artifact imported before such keys were refused: its stated value never decided anything
            raise ArtifactError(f"object-detection: {unread}. Import or convert the model again with the key "
                                "spelled as the family reads it", file="manifest.json",
                                code=ec.MANIFEST_FIELD_INVALID)
        self.family = FAMILIES[facts["family"]]
        self.params = facts["params"]
        self.input_hw = facts["input_hw"]
        self.input = buckets[0]["inputs"][0]
        self.vision = VisionInput(self.pre, self.input)     # refuses a preprocess size unlike the input's
        classes = facts["classes"]
        labels = self.read_labels()
        if labels is not None and classes is not None and len(labels) != classes:
            raise ArtifactError(f"{len(labels)} labels for {classes} classes", file=self.post.get("labels"),
                                code=ec.ARTIFACT_LABELS_MISMATCH)
        if labels is not None and classes is None and self.labels_inner_blanks:
            # the class ids come from the graph (SSD's postprocess): no count says whether a blank line is an
            # unused id or a stray newline, and reading past it would shift every label after it
            raise ArtifactError(f"labels file has blank line(s) between names (line(s) "
                                f"{', '.join(map(str, self.labels_inner_blanks[:5]))}): each line is one class id, "
                                "so every label after one would shift; write '???' for an unused id, or remove it",
                                file=self.post.get("labels"), code=ec.ARTIFACT_LABELS_MISMATCH)
        self.labels = labels or [str(i) for i in range(classes or 0)]
        self.keys = score_keys(self.labels)     # scores: "label#id" for a repeated label, as import's warning says
        try:
            self.thresholds = check_thresholds({k: self.post.get(k, v) for k, v in THRESHOLDS.items()}, None,
                                               _mismatch)
        except TaskMismatch as exc:
            raise ArtifactError(f"postprocess: {exc}", file="manifest.json", code=ec.MANIFEST_FIELD_INVALID) from None
        self.specs = {o["name"]: o for o in buckets[0]["outputs"]}
        # a family whose graph ran NMS (ssd-postprocess): not again, unless the manifest asks (an
        # artifact from before rerun_nms has none: the graph's NMS alone, as the model answers)
        self.rerun_nms = not self.family.nms_in_graph or self.post.get("rerun_nms") is True

    def check_call_options(self, options: dict, limits) -> dict:
        return check_thresholds(options, getattr(limits, "max_detections", None), _err)


    def prepare(self, raw, limits) -> Prepared:
        x, geo, pixels = self.vision.prepare(raw, limits)
        cap = getattr(limits, "max_detections", None)
        return Prepared(bucket=0, feeds={self.input["name"]: x}, length=pixels, meta={"geometry": geo, "cap": cap})

    def finish(self, outputs, prepared) -> TaskOutput:
        meta: dict[str, Any] = prepared.meta or {}
        th: dict[str, Any] = {**self.thresholds, **(meta.get("options") or {})}
        if meta.get("cap"):
            th["max_detections"] = min(th["max_detections"], meta["cap"])
        arrays = {k: dequantize(v, self.specs[k]) if k in self.specs else v for k, v in outputs.items()}
        floor = max(0.0, th["score_threshold"] - SCORE_MARGIN)
        boxes, scores, ids = self.family.decode(arrays, self.params, self.input_hw, floor)
        ok = np.flatnonzero(np.isfinite(scores) & (scores >= floor)
                            & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1]))
        geo = meta.get("geometry")
        if geo is not None and ok.size:     # a box with no pixel of the image (wholly in the letterbox padding
            o = np.round(geo.to_original(boxes[ok]), 2)     # or off the input) clips to zero size: no detection
            ok = ok[(o[:, 2] > o[:, 0]) & (o[:, 3] > o[:, 1])]
        if ok.size > MAX_CANDIDATES:    # kept in anchor order: NMS breaks score ties by it, as without the cap
            ok = ok[np.sort(np.argpartition(-scores[ok], MAX_CANDIDATES - 1)[:MAX_CANDIDATES])]
        boxes, scores, ids = boxes[ok], scores[ok], ids[ok]
        if scores.size and float(scores.max()) > 1.0:
            scores = self._probabilities(scores)
        # NMS is greedy by score: a box under the threshold never suppresses one over it, so the
        # detections are those of NMS over the boxes >= threshold alone; the rest are near misses
        limit = int(th["max_detections"]) + NEAR_MAX
        if self.rerun_nms or "iou_threshold" in (meta.get("options") or {}):
            keep = nms(boxes, scores, ids, float(th["iou_threshold"]), limit)
        else:       # NMS ran in the graph: its boxes as they are, best first
            keep = np.argsort(-scores, kind="stable")[:limit]
        over = scores[keep] >= th["score_threshold"]
        main, near = keep[over][: int(th["max_detections"])], keep[~over][:NEAR_MAX]
        dets, near_dets = (self._records(boxes[k], scores[k], ids[k], geo) for k in (main, near))
        counts: dict[str, float] = {}
        for d in dets:      # two classes of one label ("???" unused SSD ids) were merged into one entry
            key = self.keys[d["class_id"]] if 0 <= d["class_id"] < len(self.keys) else d["label"]
            counts[key] = max(counts.get(key, 0.0), d["score"])
        return TaskOutput(prediction=dets[0]["label"] if dets else None, scores=counts, detections=dets,
                          class_id=dets[0]["class_id"] if dets else None, near_detections=near_dets)

    def _probabilities(self, scores: np.ndarray) -> np.ndarray:
        """Scores past 1 within the quantisation's overshoot, clipped; further, the model answers logits (a head
        without its sigmoid, the artifact's activation ``none``): before 2026-12-07 they were reported as scores
        (10.3 on bus.jpg) and judged by the thresholds, exit 0. Import reads the activation from the graph where
        it can; this catches the graphs it cannot follow."""
        top = float(scores.max())
        if top > 1 + SCORE_SLACK:
            key = "class_activation" if self.family.name == "yolo" else "activation"
            raise ArtifactError(f"object-detection: the model's scores reach {top:.4g}, not 0..1: logits, not "
                                f"probabilities (postprocess {key} is {self.params.get(key, 'none')!r}; a head "
                                f"without its sigmoid needs {key} 'sigmoid': import the model again with it)",
                                file="manifest.json", code=ec.ARTIFACT_TASK_MISMATCH)
        return np.minimum(scores, 1.0)

    def _records(self, boxes, scores, ids, geo) -> list[dict[str, Any]]:
        out_boxes = geo.to_original(boxes) if geo is not None else boxes
        dets: list[dict[str, Any]] = []
        for b, s, c in zip(out_boxes, scores, ids):
            c = int(c)
            label = self.labels[c] if 0 <= c < len(self.labels) else str(c)
            dets.append({"label": label, "class_id": c, "score": round(float(s), 6),
                         "box": [round(float(v), 2) for v in b]})
        return dets
