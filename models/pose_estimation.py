"""pose-estimation: one image → keypoints (MoveNet SinglePose and the like).

The model has one image input and one keypoint output, ``[1, 1, K, 3]`` or
``[1, K, 3]``: per keypoint ``y``, ``x`` (normalised 0..1 over the model input)
and a score, possibly quantized (dequantized with the output spec). The points
are mapped back to the original image's pixels through the input's
:class:`~.vision.Geometry` (stretch or letterbox). With 17 keypoints they are
the COCO ones (:data:`KEYPOINT_NAMES`, :data:`SKELETON`); otherwise
``keypoint_<i>``.

``finish`` gives ``keypoints`` ``[{"name", "x", "y", "score"}]`` (original
pixels), ``prediction`` the pose score (the mean keypoint score), ``scores``
``{name: score}`` and ``outputs["image_size"]`` (``[height, width]``, what
``compare`` measures distances against).

Parity (``keypoint_pck``): the share of keypoints, over all samples, whose
candidate position lies within 5% of the image diagonal of the reference's.
"""

from __future__ import annotations

import math

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError

from .base import SCORE_SLACK, Prepared, TaskMismatch, TaskOutput, dequantize, pick_output
from .vision_task import VISION_IMPORT_OPTIONS, VisionTask
from .vision import VisionInput, vision_import_preprocess

KEYPOINT_NAMES = ("nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
                  "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee",
                  "right_knee", "left_ankle", "right_ankle")
# the COCO skeleton: pairs of keypoint indices (KEYPOINT_NAMES) a drawing joins
SKELETON = ((0, 1), (0, 2), (1, 3), (2, 4), (0, 5), (0, 6), (5, 7), (7, 9), (6, 8), (8, 10), (5, 6), (5, 11),
            (6, 12), (11, 12), (11, 13), (13, 15), (12, 14), (14, 16))
PCK_FRACTION = 0.05          # a keypoint agrees within this share of the image diagonal
PCK_SCORE_SHIFT = 0.25       # ... in a sample whose mean keypoint score moved no further (0.9 to 0.0: another answer)
CONFIDENT = 0.3              # the reference score over which a keypoint also counts in "pck_confident"
IMAGE_DTYPES = ("uint8", "int8", "float32")


def check_image_input(inputs: list[dict], task: str) -> dict:
    """The one image input ([1, H, W, 1|3] or [1, 1|3, H, W]) of a vision model, or :class:`TaskMismatch`."""
    from .image_import import image_layout

    if len(inputs) != 1:
        raise TaskMismatch(f"a {task} model takes one image input; this model has {len(inputs)} "
                           "(import it with --task tensors)", part="inputs")
    spec = inputs[0]
    if image_layout(list(spec["shape"])) is None:
        raise TaskMismatch(f"image input {spec.get('name')!r} must be [1, H, W, 1|3] or [1, 1|3, H, W], got "
                           f"{spec['shape']} (import it with --task tensors)", part="inputs")
    if spec["dtype"] not in IMAGE_DTYPES:
        raise TaskMismatch(f"image input {spec.get('name')!r} dtype {spec['dtype']} is not supported "
                           f"({', '.join(IMAGE_DTYPES)})", part="inputs")
    return spec


def keypoint_output(outputs: list[dict], name: str | None = None) -> tuple[dict, int]:
    """``(spec, K)`` of the ``[1, 1, K, 3]`` / ``[1, K, 3]`` keypoint output, or :class:`TaskMismatch`."""
    spec = pick_output(outputs, name, "a pose-estimation model has one keypoint output")
    s = [int(d) for d in spec.get("shape", [])]
    if (len(s) == 4 and s[:2] == [1, 1] or len(s) == 3 and s[0] == 1) and s[-1] == 3 and s[-2] >= 1:
        return spec, s[-2]
    raise TaskMismatch(f"not a pose-estimation model: output {spec.get('name')!r} has shape {s}; keypoints are "
                       "[1, 1, K, 3] or [1, K, 3] (y, x, score)")


def keypoint_names(k: int) -> list[str]:
    return list(KEYPOINT_NAMES) if k == len(KEYPOINT_NAMES) else [f"keypoint_{i}" for i in range(k)]


class PoseEstimation(VisionTask):
    name = "pose-estimation"
    parity_metric = "keypoint_pck"
    parity_best = 1.0
    manifest_sections = {"preprocess": {"size": list}}
    importable = True
    import_options = VISION_IMPORT_OPTIONS

    @classmethod
    def build_sections(cls, request, writer, outputs):
        return {"kind": "image", **(request.preprocess or {})}, {"output": keypoint_output(outputs)[0]["name"]}

    @classmethod
    def check_io(cls, inputs, outputs, post=None) -> dict:
        """One image input and one keypoint output (:func:`keypoint_output`)."""
        check_image_input(inputs, cls.name)
        spec, k = keypoint_output(outputs, (post or {}).get("output"))
        return {"output": spec, "keypoints": k}

    @classmethod
    def import_sections(cls, model, options, warnings):
        spec = check_image_input(model["inputs"], cls.name)
        out = cls.check_io(model["inputs"], model["outputs"])["output"]
        # MoveNet: the image stretched to the square input (libcoral's CopyResizedImage)
        return vision_import_preprocess(spec, options, warnings, resize="stretch"), {"output": out["name"]}

    def __init__(self, manifest, read_file, buckets):
        super().__init__(manifest, read_file, buckets)
        if len(buckets) != 1:
            raise ArtifactError(f"{self.name} takes exactly one bucket", file="manifest.json",
                                code=ec.MANIFEST_FIELD_INVALID)
        try:
            check_image_input(buckets[0]["inputs"], self.name)
            spec, k = keypoint_output(buckets[0]["outputs"], self.post.get("output"))
        except TaskMismatch as exc:
            raise ArtifactError(str(exc), file="manifest.json", code=ec.ARTIFACT_TASK_MISMATCH) from None
        self.input = buckets[0]["inputs"][0]
        self.output: str = spec["name"]
        self.count = k
        self.names = keypoint_names(k)
        self.vision = VisionInput(self.pre, self.input)


    def prepare(self, raw, limits) -> Prepared:
        x, geo, pixels = self.vision.prepare(raw, limits)
        return Prepared(bucket=0, feeds={self.input["name"]: x}, length=pixels, meta={"geometry": geo})

    def finish(self, outputs, prepared) -> TaskOutput:
        geo = (prepared.meta or {})["geometry"]
        rows = dequantize(outputs[self.output], self.output_spec(self.output)).reshape(-1, 3)[:self.count]
        _check_normalised(rows, self.output)
        xy = np.stack([rows[:, 1] * self.vision.width, rows[:, 0] * self.vision.height], axis=1)
        pts = geo.points_to_original(xy).tolist()
        scores = _probabilities(rows[:, 2], self.output).tolist()
        kps = [{"name": n, "x": p[0], "y": p[1], "score": s} for n, p, s in zip(self.names, pts, scores)]
        return TaskOutput(prediction=float(np.mean(scores)) if scores else 0.0,
                          scores={n: s for n, s in zip(self.names, scores)}, keypoints=kps,
                          outputs={"image_size": np.array([geo.height, geo.width], dtype=np.int32)})

    @staticmethod
    def compare(reference: list[TaskOutput], candidate: list[TaskOutput]) -> dict:
        """``keypoint_pck``: the share of keypoints (all samples, matched by name) within
        :data:`PCK_FRACTION` of the image diagonal of the reference's, none in a sample whose mean
        keypoint score moved by over :data:`PCK_SCORE_SHIFT`; also the mean and max
        distance in pixels, and ``pck_confident`` over keypoints the reference scores over
        :data:`CONFIDENT`."""
        hits, dists, confident = [], [], []
        for ref, cand in zip(reference, candidate):
            rk = {k["name"]: k for k in ref.keypoints or []}
            ck = {k["name"]: k for k in cand.keypoints or []}
            diag = _diagonal(ref, list(rk.values()) + list(ck.values()))
            # a sample whose keypoint scores moved as a whole (0.9 against 0.0: every keypoint hidden at any
            # threshold) agrees nowhere: before 2026-12-07 positions alone passed a candidate that scores nothing.
            # Per keypoint a score is no test: one pose model's scores differ by up to 0.5 between two resizes
            shifted = (score_shift(list(rk.values()), list(ck.values())) or 0.0) > PCK_SCORE_SHIFT
            for name, r in rk.items():
                c = ck.get(name)
                d = math.hypot(c["x"] - r["x"], c["y"] - r["y"]) if c is not None else math.inf
                hit = d <= PCK_FRACTION * diag and not shifted
                hits.append(hit)
                dists.append(d)
                if r["score"] >= CONFIDENT:
                    confident.append(hit)
        finite = [d for d in dists if math.isfinite(d)]
        return {"metric": "keypoint_pck", "value": float(np.mean(hits)) if hits else None,
                "samples": min(len(reference), len(candidate)), "keypoints": len(hits),
                "pck_confident": float(np.mean(confident)) if confident else None,
                "mean_pixel_distance": float(np.mean(finite)) if finite else None,
                "max_pixel_distance": float(max(finite)) if finite else None}


def score_shift(a: list[dict], b: list[dict]) -> float | None:
    """How far the mean keypoint score moved between two answers' keypoints (None where one has none): the
    parity's and shadow's test for a candidate whose scores moved as a whole (:data:`PCK_SCORE_SHIFT`)."""
    if not a or not b:
        return None
    return abs(float(np.mean([float(k["score"]) for k in a])) - float(np.mean([float(k["score"]) for k in b])))


def _check_normalised(rows: np.ndarray, name: str) -> None:
    """MoveNet's rows are (y, x) in 0..1 of the input and a score. A model that answers in pixels had every
    keypoint clipped to the image's corner with exit 0: coordinates past -4..5 (no point of a 0..1 model is
    four frames outside it; a pixel model's reach the input's size) are refused instead."""
    if not rows.size:
        return
    lo, hi = float(rows[:, :2].min()), float(rows[:, :2].max())
    if lo < -4.0 or hi > 5.0:
        raise ArtifactError(f"output {name!r} is not normalised keypoints: its y, x span {lo:.4g}..{hi:.4g} (a pose "
                            "model here answers y, x in 0..1 of its input; pixel coordinates would put every "
                            "keypoint in the image's corner)", file="manifest.json", code=ec.ARTIFACT_TASK_MISMATCH)


def _probabilities(raw: np.ndarray, name: str) -> np.ndarray:
    """The keypoint scores as probabilities. A model answering logits (-3.2, 4.1) had them reported as scores,
    and a caller's 0.3 threshold judged them, exit 0: scores past -0.01..1.01 are refused; within it, the
    quantisation's overshoot is clipped to 0..1 (a uint8 step is 1/256)."""
    s = raw.astype(float)
    if s.size and (float(s.min()) < -SCORE_SLACK or float(s.max()) > 1 + SCORE_SLACK):
        raise ArtifactError(f"output {name!r} does not give keypoint scores as probabilities: they span "
                            f"{float(s.min()):.4g}..{float(s.max()):.4g}, not 0..1 (logits? the model needs its "
                            "sigmoid)", file="manifest.json", code=ec.ARTIFACT_TASK_MISMATCH)
    return np.clip(s, 0.0, 1.0)


def _diagonal(out: TaskOutput, kps: list[dict]) -> float:
    """The image diagonal in pixels (``outputs["image_size"]``), else the keypoints' extent."""
    size = (out.outputs or {}).get("image_size")
    if size is not None and np.size(size) == 2:
        h, w = (float(v) for v in np.asarray(size).reshape(-1))
        return math.hypot(h, w)
    if not kps:
        return 1.0
    xs, ys = [k["x"] for k in kps], [k["y"] for k in kps]
    return max(math.hypot(max(xs) - min(xs), max(ys) - min(ys)), 1.0)
