"""What convert calibrates and measures parity on must be what it records (the 2026-12-07 convert
inputs hunt): samples the model cannot take are not counted, each input counts once and is never
both calibrated on and "held out", --parity-data naming the calibration data through another path
is refused, and a one-image .npy is not read as a batch of image rows."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge_runtime.converters.zoo import ZOO, convert_request
from factories import convert_digits
from edge_runtime.errors import InputError

DIGITS = ZOO / "digits-cnn"


def _convert(out, monkeypatch=None, **kw):
    """The digits convert (onnx-int8, no probe set) with ``kw``: the manifest, the progress lines and
    (with ``monkeypatch``) the Samples split_samples returned."""
    return convert_digits(out, monkeypatch, **kw)


def _calibration_copy(tmp_path):
    cal = tmp_path / "cal"
    shutil.copytree(DIGITS / "calibration", cal)
    return cal, sorted(cal.glob("*.png"))


def test_samples_the_model_cannot_take_are_not_counted(tmp_path):
    # before: 10 macOS "._x.png" resource forks beside 200 digits: the manifest recorded 158
    # calibration samples (8 of them junk the quantizer never saw) and a split "of 210"
    # (a dot-file is no sample at all now: the junk here has a plain name)
    cal, files = _calibration_copy(tmp_path)
    for f in files[:10]:
        (cal / f"junk_{f.name}").write_bytes(b"\x00\x05\x16\x07Mac OS X        ")
    man, lines, _ = _convert(tmp_path / "a", calibration=cal, parity_data=None)
    v = man["variants"][0]
    assert v["quantization"]["calibration"]["samples"] == 150
    assert v["quantization"]["calibration"]["left_out"] == "10 the model cannot take left out"     # the record too
    assert v["parity"]["samples"] == 50 and "skipped_samples" not in v["parity"]
    assert v["parity"]["data"] == "held-out split of cal (50 of 200; 10 the model cannot take left out)"
    assert any(x.startswith("warning: 10 of the 210 --calibration samples cannot be prepared") for x in lines), lines


def test_a_repeated_image_is_one_sample_and_never_on_both_sides_of_the_split(tmp_path, monkeypatch):
    # before: 40 digits copied under a second name were 240 samples; copies of ~10 of them were
    # held out while their twin was calibrated on, so "held-out" parity was partly calibration data
    cal, files = _calibration_copy(tmp_path)
    for f in files[:40]:
        shutil.copy(f, cal / f"copy_{f.name}")
    man, lines, samples = _convert(tmp_path / "a", monkeypatch, calibration=cal, parity_data=None)
    calibrated = {bytes(s) for s in samples.calib}
    assert not [s for s in samples.held if bytes(s) in calibrated]
    assert len(samples.calib) == 150 and len(samples.held) == 50
    assert len(calibrated) == 150 and len({bytes(s) for s in samples.held}) == 50
    v = man["variants"][0]
    assert v["quantization"]["calibration"]["samples"] == 150 and v["parity"]["samples"] == 50
    assert "40 repeats left out" in v["parity"]["data"]
    assert v["quantization"]["calibration"]["left_out"] == "40 repeats left out"
    assert any("40 of the 240 --calibration samples repeat an input" in x for x in lines), lines


def test_parity_data_repeats_count_once(tmp_path):
    # before: 20 held-out digits, each also under a second name: "parity on 40 held-out samples"
    par = tmp_path / "par"
    for i, f in enumerate(sorted((DIGITS / "held_out").rglob("*.png"))[::18]):
        (par / f"{i % 10}").mkdir(parents=True, exist_ok=True)
        shutil.copy(f, par / f"{i % 10}" / f"a{i:03d}.png")
        shutil.copy(f, par / f"{i % 10}" / f"b{i:03d}.png")
    man, lines, _ = _convert(tmp_path / "a", parity_data=par, allow_few_samples=True)
    p = man["variants"][0]["parity"]
    assert p["samples"] == 20, p
    assert p["data"] == "par (20 samples; 20 repeats left out)"


def test_a_calibration_image_in_another_format_is_not_held_out(tmp_path):
    # before: a calibration PNG saved again as BMP (the same pixels) was not byte-equal, so it
    # counted as held-out parity on an image the quantizer had calibrated on
    par = tmp_path / "par" / "x"
    par.mkdir(parents=True)
    for i, f in enumerate(sorted((DIGITS / "held_out").rglob("*.png"))[::18]):
        shutil.copy(f, par / f"h{i:03d}.png")
    for i, f in enumerate(sorted((DIGITS / "calibration").glob("*.png"))[:10]):
        Image.open(f).save(par / f"c{i:03d}.bmp")
    man, lines, _ = _convert(tmp_path / "a", parity_data=tmp_path / "par", allow_few_samples=True)
    p = man["variants"][0]["parity"]
    assert p["samples"] == 20, p
    assert "10 that are also calibration samples left out" in p["data"]
    assert any(x.startswith("warning: 10 of the 30 --parity-data samples are also calibration samples")
               for x in lines), lines


@pytest.mark.parametrize("how", ["symlink", "dot-slash"])
def test_parity_data_that_is_the_calibration_path_is_refused_whatever_the_cap(tmp_path, monkeypatch, how):
    # before: with the calibration capped at 100 of its 200 images, --parity-data naming the same
    # folder (through a link, or ./) was "measured on the 100 others" with exit 0
    if how == "symlink":
        par = tmp_path / "link"
        os.symlink(DIGITS / "calibration", par, target_is_directory=True)
    else:
        monkeypatch.chdir(DIGITS)
        par = Path("./calibration/")         # relative, beside the zoo request's absolute --calibration
    with pytest.raises(InputError) as exc:
        _convert(tmp_path / "a", parity_data=par, max_calibration=100)
    assert exc.value.code == "convert_parity_is_calibration"
    assert "is the --calibration data" in exc.value.message
    assert not (tmp_path / "a").exists()


def test_a_one_image_npy_is_not_read_as_a_batch_of_rows(tmp_path):
    # before: a 64x64x3 image saved with numpy.save calibrated as 64 "images" of 64x3 gray pixels
    # each, recorded as 64 calibration samples, exit 0
    rng = np.random.default_rng(0)
    np.save(tmp_path / "one.npy", rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8))
    with pytest.raises(InputError) as exc:
        _convert(tmp_path / "a", calibration=tmp_path / "one.npy")
    assert exc.value.code == "convert_calibration_invalid"
    assert "one 64x64x3 image, not a batch" in exc.value.message
    batch = rng.integers(0, 256, size=(40, 8, 8), dtype=np.uint8)      # a batch of grayscale images still is one
    np.save(tmp_path / "batch.npy", batch)
    man, _, _ = _convert(tmp_path / "b", calibration=tmp_path / "batch.npy")
    assert man["variants"][0]["quantization"]["calibration"]["samples"] == 40


def test_parity_data_given_as_dot_is_named_in_the_record(tmp_path, monkeypatch):
    # before: `--parity-data .` (run from inside the held-out folder) recorded parity.data " (360 samples)"
    monkeypatch.chdir(DIGITS / "held_out")
    man, _, _ = _convert(tmp_path / "a", parity_data=Path("."))
    assert man["variants"][0]["parity"]["data"] == "held_out (360 samples)"


def test_the_calibration_fingerprint_tells_sample_lists_apart():
    # before: an 8x8 image array and a 64-value row of the same bytes had one fingerprint, and so
    # did ["a\x00", "b"] and ["a", "\x00b"]: the manifest named two calibration sets alike
    from edge_runtime.converters.request import fingerprint

    a = np.arange(64, dtype=np.uint8)
    assert fingerprint([a.reshape(8, 8)]) != fingerprint([a]) != fingerprint([a.astype(np.int8)])
    assert fingerprint(["a\x00", "b"]) != fingerprint(["a", "\x00b"])
    assert fingerprint([a.reshape(8, 8), a]) == fingerprint([a.reshape(8, 8).copy(), a.copy()])


def test_dot_files_and_dot_folders_are_no_calibration_samples(tmp_path):
    # a .ipynb_checkpoints copy or a macOS ._x.png was loaded as a sample (score skips them)
    from edge_runtime.models.image import load_image_samples

    cal, files = _calibration_copy(tmp_path)
    (cal / ".ipynb_checkpoints").mkdir()
    shutil.copy(files[0], cal / ".ipynb_checkpoints" / "edited.png")
    (cal / f"._{files[1].name}").write_bytes(b"\x00\x05\x16\x07Mac OS X        ")
    assert len(load_image_samples(cal)) == len(files)
    with open(tmp_path / "B.NPY", "wb") as fh:          # the suffix in any case (np.save would add .npy)
        np.save(fh, np.zeros((3, 8, 8), dtype=np.uint8))
    assert len(load_image_samples(tmp_path / "B.NPY")) == 3


@pytest.mark.parametrize("head, rows, want", [
    ("label\tsentence", ["1\tgreat movie", "0\tdull"], ["great movie", "dull"]),
    ("id\tsentence\tlabel", ["7\tgreat movie\t1", "8\tdull\t0"], ["great movie", "dull"]),
    ("sentence\tlabel", ["great\tmovie\t1", "dull\t0"], ["great\tmovie", "dull"]),
    (None, ["great movie\t1", "dull\t0"], ["great movie", "dull"]),
])
def test_a_tsv_calibrates_its_text_column(tmp_path, head, rows, want):
    # label<TAB>sentence calibrated the labels ['1', '0'], id<TAB>sentence<TAB>label "7<TAB>great movie"
    from edge_runtime.models.text import load_text_samples

    for name in ("cal.tsv", "CAL.TSV"):           # cal.TSV was read as plain lines, the label column as text
        f = tmp_path / name
        f.write_text("\ufeff" + "\n".join(([head] if head else []) + rows) + "\n", encoding="utf-8")
        assert load_text_samples(f) == want, name   # the byte order mark is no part of the first text


def test_a_tsv_whose_text_column_cannot_be_told_is_refused(tmp_path):
    from edge_runtime.models.text import load_text_samples

    f = tmp_path / "cal.tsv"
    f.write_text("id\tbody\tlabel\n7\tgreat\t1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="which column"):
        load_text_samples(f)


def test_a_byte_capped_probe_set_is_spread_over_the_classes(tmp_path):
    # the cap kept a prefix of a list spread for 32: digits with --probe-max-bytes 3000 kept 4 probes
    # predicted 0, 0, 0, 1
    import json

    from edge_runtime.converters import pipeline

    out = tmp_path / "a"
    pipeline.convert(convert_request("digits-cnn", "image-classification", out, probe_samples=32,
                                     probe_max_bytes=3000), lambda line: None)
    man = json.loads((out / "manifest.json").read_text())
    probe = man["probe"]
    assert 2 <= probe["samples"] < 32 and probe["max_samples"] == 32
    with np.load(out / probe["reference"]) as ref:
        meta = json.loads(bytes(ref["meta"]).decode())
    classes = {m.get("prediction") for m in meta}
    assert len(classes) >= min(probe["samples"], 4) - 1, meta


def test_the_calibration_source_of_dot_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(DIGITS / "calibration")
    man, _, _ = _convert(tmp_path / "a", calibration=Path("."))
    assert man["variants"][0]["quantization"]["calibration"]["source"] == "calibration"
