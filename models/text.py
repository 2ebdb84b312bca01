"""Shared text pre-processing: the artifact's own tokenizer, length buckets.

One ``tokenizers.Tokenizer`` truncating at the largest bucket and not padding;
each input then goes to the smallest bucket that fits and is right-padded to
it with numpy. This gives the same ids and masks as setting truncation and
padding per bucket (the MiniLM tokenizer.json has 128 built in, so both are
reset here), at the cost of a single encode. The truncation keeps the side the
tokenizer.json states (a "Left" one keeps a text's last tokens); the pad id is
the tokenizer's own (convert writes it; a model without a mask input refuses
another).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError

from .base import Prepared, Task, reject_type

ROLE_NAMES = {      # Hugging Face exports' names first, then TF-Hub / TFLite BERT's (MobileBERT: input_mask, segment_ids)
    "ids": ("input_ids", "input_word_ids"),
    "mask": ("attention_mask", "input_mask"),
    "type_ids": ("token_type_ids", "segment_ids", "input_type_ids"),
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
                "max_length": max(request.buckets), "pad_id": _own_pad_id(Path(request.tokenizer))}

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
            # an input no role fills (position_ids, a mask under another name) loaded, and then every call
            # failed as "inference_failed" on the device: the artifact's, said at load
            unfilled = sorted(set(names) - set(roles.values()))
            if unfilled:
                raise ArtifactError(f"bucket {b['name']}: the text task fills token ids, attention mask and token "
                                    f"type ids ({', '.join(sorted(roles.values()))}), not {', '.join(unfilled)} "
                                    f"(preprocess.inputs names an input for a role)", file="manifest.json",
                                    code=ec.MANIFEST_FIELD_INVALID)
            odd = sorted(n for n in roles.values() if list(names[n]["shape"]) != list(shape))
            if odd:
                raise ArtifactError(f"bucket {b['name']}: {', '.join(odd)} must have the token ids' shape {shape}",
                                    file="manifest.json", code=ec.MANIFEST_FIELD_INVALID)
            lengths.append(shape[1])
            self._roles.append({r: (n, np.dtype(names[n]["dtype"])) for r, n in roles.items()})
        self.lengths = lengths
        self._order = sorted(range(len(lengths)), key=lengths.__getitem__)
        self.max_length = max(lengths)
        self.tokenizer.no_padding()
        self._truncate_at(self.max_length, rel)
        self.pad_id = int(self.pre.get("pad_id", 0))
        top = max(self.tokenizer.get_vocab_size(with_added_tokens=True) - 1, self.pad_id)
        for filled in self._roles:
            name, dtype = filled["ids"]
            if not _holds(dtype, top):
                raise ArtifactError(f"token id input {name!r} is {dtype}: it cannot hold id {top} of the tokenizer's "
                                    f"vocabulary exactly", file="manifest.json", code=ec.MANIFEST_FIELD_INVALID)
        own_pad = _pad_of(self.tokenizer)
        if own_pad is not None and own_pad[1] != self.pad_id and any("mask" not in r for r in self._roles):
            raise ArtifactError(f"the manifest pads with id {self.pad_id}, the tokenizer's pad token {own_pad[0]!r} "
                                f"is {own_pad[1]}: the model has no attention mask input, so it reads the padding "
                                f"as text (convert again: it writes the tokenizer's pad id)", file="manifest.json",
                                code=ec.MANIFEST_FIELD_INVALID)

    def _truncate_at(self, max_length: int, rel: str) -> None:
        """Truncate at ``max_length`` tokens from the side the artifact's tokenizer truncates
        (``enable_truncation(max_length=...)`` alone reset a tokenizer.json's "Left" to the right:
        a text was answered on its first tokens where the model keeps the last ones). The stride
        (which only shapes the overflow windows, whose overlap would be counted twice in
        ``input_length``) and the strategy (for one text "longest_first" and "only_first" cut the
        same tokens; "only_second" fails every single text) are not the text tasks' to keep.
        The special tokens the post-processor adds must leave room for one token of text: a
        ``[1, 2]`` bucket filled by [CLS] [SEP] answered every text "input_empty", and one shorter
        than them was not truncated at all (an untyped numpy error)."""
        own = self.tokenizer.truncation or {}
        direction = str(own.get("direction", "right")).lower()
        if direction not in ("left", "right"):
            raise ArtifactError(f"tokenizer truncation direction {own.get('direction')!r} is not left or right",
                                file=rel, code=ec.ARTIFACT_FILE_INVALID)
        special = self.tokenizer.num_special_tokens_to_add(False)
        if max_length <= special:
            raise ArtifactError(f"the longest bucket holds {max_length} tokens and the tokenizer adds {special} "
                                f"special tokens to every text: no token of any text fits", file="manifest.json",
                                code=ec.MANIFEST_FIELD_INVALID)
        self.tokenizer.enable_truncation(max_length=max_length, stride=0, strategy="longest_first",
                                         direction=direction)

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
        tokens = n
        if truncated:   # the drift signal counts what was cut off too (content tokens of the overflow)
            n += sum(sum(1 for m in o.special_tokens_mask if not m) for o in enc.overflowing)
        return Prepared(bucket=idx, feeds=feeds, truncated=truncated, length=n, meta={"tokens": tokens})

    def mask_of(self, prepared: Prepared) -> np.ndarray:
        """The attention mask fed, or (a model without one) the text's own tokens: its first
        ``tokens`` positions. ``ids != pad_id`` dropped every token whose id is the pad id (a
        RoBERTa-style vocabulary's ``<s>`` is 0, the manifest's pad id) from the mean pooling."""
        roles = self._roles[prepared.bucket]
        if "mask" in roles:
            return prepared.feeds[roles["mask"][0]]
        ids = prepared.feeds[roles["ids"][0]]
        tokens = (prepared.meta or {}).get("tokens")
        if tokens is None:
            return (ids != self.pad_id).astype(np.int64)
        mask = np.zeros(ids.shape, dtype=np.int64)
        mask[..., :tokens] = 1
        return mask


TEXT_COLUMNS = ("sentence", "text")      # a TSV header's text column (SST-2's "sentence")


def load_text_samples(path) -> list[str]:
    """Calibration/eval text: a .txt file (one sample a line), JSONL ("text") or a TSV
    (text<TAB>label; with a header naming a ``sentence``/``text`` column and a ``label`` one, that
    column). The suffix in any case (``cal.TSV`` calibrated its label column as text); a UTF-8 byte
    order mark is no part of the first text."""
    import json

    p = Path(path)
    lines = p.read_text(encoding="utf-8-sig").splitlines()
    suffix = p.suffix.lower()
    if suffix == ".tsv":
        return [r for r in _tsv_texts(p, lines) if r.strip()]
    if suffix == ".jsonl":
        out = []
        for i, line in enumerate(lines, 1):
            if line.strip():
                rec = json.loads(line)
                if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                    raise ValueError(f"{p}:{i}: JSONL records need a string field 'text'")
                out.append(rec["text"])
        return out
    return [line for line in lines if line.strip()]


def _tsv_texts(p: Path, lines: list[str]) -> list[str]:
    """The text column of a TSV: without a header, all but the last column (text<TAB>label, the
    text may hold tabs); with one (a ``label`` column), the column named ``sentence`` or ``text``,
    or the other of two. ``label<TAB>sentence`` calibrated the labels and ``id<TAB>sentence<TAB>label``
    the ids with the texts."""
    names = [c.strip().lower() for c in lines[0].split("\t")] if lines else []
    if "label" not in names:
        return [line.rpartition("\t")[0] if "\t" in line else line for line in lines]
    named = [i for i, n in enumerate(names) if n in TEXT_COLUMNS]
    if len(named) == 1:
        col = named[0]
    elif len(names) == 2:
        col = 1 - names.index("label")
    else:
        raise ValueError(f"{p}: which column of {lines[0]!r} is the text? Name it 'sentence' or 'text'")
    if col == 0 and len(names) == 2:                # text<TAB>label: the text may hold tabs
        return [line.rpartition("\t")[0] for line in lines[1:] if "\t" in line]
    return [cells[col] for cells in (line.split("\t") for line in lines[1:]) if len(cells) == len(names)]


def _holds(dtype: np.dtype, top: int) -> bool:
    """Whether every id 0..``top`` is exact in ``dtype`` (float16 ids rounded 2049 to 2048: another
    token, with exit 0; int8 ones overflowed at 128, an untyped error on every call)."""
    if dtype.kind in "iu":
        return top <= np.iinfo(dtype).max
    if dtype.kind == "f":
        return top <= 2 ** (np.finfo(dtype).nmant + 1)
    return False


_PAD_TOKENS = ("[PAD]", "<pad>", "<|pad|>", "<|padding|>")


def _pad_of(tokenizer) -> tuple[str, int] | None:
    """The tokenizer's own pad token and id: its padding setting's, else a pad token of its
    vocabulary (None: it has none)."""
    padding = tokenizer.padding
    if padding and padding.get("pad_token") is not None and padding.get("pad_id") is not None:
        return str(padding["pad_token"]), int(padding["pad_id"])
    for token in _PAD_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token, int(token_id)
    return None


def _own_pad_id(path: Path) -> int:
    """The pad id convert writes: the tokenizer's own (a RoBERTa-style ``<pad>`` is 1, and id 0 is
    ``<s>``: 0 was written for every tokenizer), 0 for one without a pad token. A file that does
    not load is refused where the artifact's task loads it (with the file named)."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception:
        return 0
    own = _pad_of(tokenizer)
    return 0 if own is None else own[1]


_FEW_TOKENS = 4     # an encoding this short may be the special tokens alone ([CLS] [SEP])


def _only_special(enc, n: int) -> bool:
    """True when the tokenizer found nothing in the text: ``"\u200b"`` or NUL bytes pass
    ``str.strip`` but normalise to no token, and their embedding would be that of an empty text."""
    mask = getattr(enc, "special_tokens_mask", None)
    return n == 0 or (mask is not None and all(mask))
