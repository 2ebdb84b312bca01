"""Shared text pre-processing: the artifact's own tokenizer, length buckets.

One ``tokenizers.Tokenizer`` truncating at the largest bucket and not padding;
each input then goes to the smallest bucket that fits and is right-padded to
it with numpy. This gives the same ids and masks as setting truncation and
padding per bucket (the MiniLM tokenizer.json has 128 built in, so both are
reset here), at the cost of a single encode.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError

from .base import Prepared, Task, reject_type

ROLE_NAMES = {
    "ids": ("input_ids",),
    "mask": ("attention_mask",),
    "type_ids": ("token_type_ids",),
}


class TextTask(Task):
    """What the text tasks share: a text string in, the artifact's tokenizer, sequence buckets."""

    input_kind = "text"
    score_field = "text"
    length_unit = "tokens"
    sequence_buckets = True
    default_buckets = (64, 128)
    recipe_family = "transformer"
    needs_tokenizer = True
    manifest_sections = {"preprocess": {"tokenizer": str}}
    manifest_files: tuple[str, ...] = ("tokenizer",)

    @classmethod
    def check_sample_path(cls, path, what: str) -> None:
        p = Path(path)
        if p.is_dir():
            raise InputError(f"{what} {p} is a directory; text tasks take a .txt (one sample a line), .jsonl "
                             f"('text') or .tsv (text<TAB>label) file", code=ec.CONVERT_CALIBRATION_INVALID)

    @staticmethod
    def text_preprocess(request, writer) -> dict:
        """The text ``preprocess`` section: the tokenizer file (into the artifact) and the longest bucket."""
        return {"kind": "text", "tokenizer": writer.add_file("tokenizer.json", request.tokenizer),
                "max_length": max(request.buckets), "pad_id": 0}

    def __init__(self, manifest, read_file, buckets):
        super().__init__(manifest, read_file, buckets)
        from tokenizers import Tokenizer

        rel = self.pre.get("tokenizer")
        if not rel:
            raise ArtifactError("text task without a tokenizer", file="manifest.json", code=ec.MANIFEST_FIELD_MISSING)
        try:
            self.tokenizer = Tokenizer.from_str(read_file(rel).decode("utf-8"))
        except Exception as exc:
            raise ArtifactError(f"tokenizer does not load: {exc}", file=rel, code=ec.ARTIFACT_FILE_INVALID) from None
        lengths = []
        self._roles = []
        for b in buckets:
            names = {t["name"]: t for t in b["inputs"]}
            roles = {}
            for role, candidates in ROLE_NAMES.items():
                configured = self.pre.get("inputs", {}).get(role)
                for cand in ([configured] if configured else list(candidates)):
                    if cand in names:
                        roles[role] = cand
            if "ids" not in roles:
                raise ArtifactError(f"bucket {b['name']} has no token id input", file="manifest.json",
                                    code=ec.MANIFEST_FIELD_INVALID)
            shape = names[roles["ids"]]["shape"]
            if len(shape) != 2 or shape[0] != 1:
                raise ArtifactError(f"bucket {b['name']}: token inputs must be [1, seq]", file="manifest.json",
                                    code=ec.MANIFEST_FIELD_INVALID)
            lengths.append(shape[1])
            self._roles.append({r: (n, np.dtype(names[n]["dtype"])) for r, n in roles.items()})
        self.lengths = lengths
        self._order = sorted(range(len(lengths)), key=lengths.__getitem__)
        self.max_length = max(lengths)
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_length)
        self.pad_id = int(self.pre.get("pad_id", 0))

    def warmup_sample(self):
        return "warm up the tokenizer"

    def joined_sample(self, a, b):
        """Two texts as one, a space between (a two-sentence review is still a review)."""
        return f"{a} {b}" if isinstance(a, str) and isinstance(b, str) else None

    def bucket_samples(self, limits) -> list:
        """Per bucket the longest "hello hello ..." that goes to it untruncated (None: none does)."""
        out = []
        for idx, length in enumerate(self.lengths):
            sample = None
            for k in range(max(length - 2, 1), 0, -1):
                text = "hello " * k
                p = self.prepare(text, limits)
                if p.bucket == idx and not p.truncated:
                    sample = text
                    break
            out.append(sample)
        return out

    def request_bytes(self, raw) -> int:
        """The text's size, also when it comes as ``{"text": ...}`` (``text_of`` takes that form:
        it was counted 0 bytes, so the request limit let any size through)."""
        if isinstance(raw, dict) and set(raw) == {"text"}:
            raw = raw["text"]
        return super().request_bytes(raw)

    def text_of(self, raw, limits) -> str:
        if isinstance(raw, dict) and set(raw) == {"text"}:
            raw = raw["text"]
        if isinstance(raw, (bytes, bytearray, memoryview)):
            try:
                raw = bytes(raw).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"text is not valid UTF-8: {exc.reason} at byte {exc.start}",
                                 code=ec.INPUT_BAD_ENCODING) from None
        if not isinstance(raw, str):
            reject_type(raw, "a text string")
        if len(raw) > limits.max_text_chars:
            raise InputError(f"text has {len(raw)} characters, over the limit of {limits.max_text_chars}",
                             code=ec.INPUT_TOO_LONG, limit=limits.max_text_chars)
        if not raw.strip():
            raise InputError("text is empty", code=ec.INPUT_EMPTY)
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError("text is not valid unicode: a lone surrogate, or a byte of the input file that is "
                             "not UTF-8", code=ec.INPUT_BAD_ENCODING) from None
        return raw

    def prepare(self, raw, limits) -> Prepared:
        return self._prepared(self.tokenizer.encode(self.text_of(raw, limits)))

    def prepare_batch(self, raws: list, limits) -> list:
        """One ``encode_batch`` for the batch's valid texts: it releases the GIL while it runs (a
        per-text ``encode`` holds it for the 5 ms switch interval at a time, stalling the thread
        that feeds OpenVINO's queue) and takes 110-140 µs a MiniLM text instead of 170-270. Its
        encodings are ``encode``'s (the same truncation, no padding)."""
        out: list = [None] * len(raws)
        texts, where = [], []
        for i, raw in enumerate(raws):
            try:
                texts.append(self.text_of(raw, limits))
                where.append(i)
            except Exception as exc:
                out[i] = exc
        if texts:
            for i, enc in zip(where, self.tokenizer.encode_batch(texts)):
                try:
                    out[i] = self._prepared(enc)
                except Exception as exc:
                    out[i] = exc
        return out

    def _prepared(self, enc) -> Prepared:
        token_ids = enc.ids          # each attribute access converts from Rust: read once
        n = len(token_ids)
        if n <= _FEW_TOKENS and _only_special(enc, n):
            raise InputError("text has no tokens (only whitespace, control or zero-width characters)",
                             code=ec.INPUT_EMPTY)
        truncated = n >= self.max_length and bool(enc.overflowing)
        for idx in self._order:
            if self.lengths[idx] >= n:
                break
        length = self.lengths[idx]
        roles = self._roles[idx]
        feeds = {}
        name, dtype = roles["ids"]
        ids = np.full((1, length), self.pad_id, dtype=dtype)
        ids[0, :n] = token_ids
        feeds[name] = ids
        if "mask" in roles:
            name, dtype = roles["mask"]
            mask = np.zeros((1, length), dtype=dtype)
            mask[0, :n] = 1
            feeds[name] = mask
        if "type_ids" in roles:
            name, dtype = roles["type_ids"]
            tt = np.zeros((1, length), dtype=dtype)
            tt[0, :n] = enc.type_ids
            feeds[name] = tt
        if truncated:   # the drift signal counts what was cut off too (content tokens of the overflow)
            n += sum(sum(1 for m in o.special_tokens_mask if not m) for o in enc.overflowing)
        return Prepared(bucket=idx, feeds=feeds, truncated=truncated, length=n)

    def mask_of(self, prepared: Prepared) -> np.ndarray:
        roles = self._roles[prepared.bucket]
        if "mask" in roles:
            return prepared.feeds[roles["mask"][0]]
        ids = prepared.feeds[roles["ids"][0]]
        return (ids != self.pad_id).astype(np.int64)


def load_text_samples(path) -> list[str]:
    """Calibration/eval text: a .txt file (one sample a line) or JSONL ("text")."""
    import json

    p = Path(path)
    lines = p.read_text(encoding="utf-8").splitlines()
    if p.suffix == ".tsv":  # text<TAB>label (e.g. SST-2): the text column, header skipped
        rows = [line.rpartition("\t")[0] if "\t" in line else line for line in lines]
        if lines and lines[0].rpartition("\t")[2].strip().lower() == "label":
            rows = rows[1:]
        return [r for r in rows if r.strip()]
    if p.suffix == ".jsonl":
        out = []
        for i, line in enumerate(lines, 1):
            if line.strip():
                rec = json.loads(line)
                if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                    raise ValueError(f"{p}:{i}: JSONL records need a string field 'text'")
                out.append(rec["text"])
        return out
    return [line for line in lines if line.strip()]


_FEW_TOKENS = 4     # an encoding this short may be the special tokens alone ([CLS] [SEP])


def _only_special(enc, n: int) -> bool:
    """True when the tokenizer found nothing in the text: ``"\u200b"`` or NUL bytes pass
    ``str.strip`` but normalise to no token, and their embedding would be that of an empty text."""
    mask = getattr(enc, "special_tokens_mask", None)
    return n == 0 or (mask is not None and all(mask))
