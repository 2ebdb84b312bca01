"""What an image folder gives convert to calibrate and measure parity on is what it holds, and
what it does not read is said (the 2026-12-07 calibration folder hunt): symlinked class folders
are entered, each real folder once, loops not; files in image formats the runtime does not decode
(.webp, .gif, .tif) are counted in ``calibration.left_out`` and warned of, and a folder holding
only such files is a typed error naming them; a FIFO named ``x.png`` no longer blocks the read;
a one-image ``.npy`` of H×W×1 or H×W pixels is not read as a batch of rows."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.converters.zoo import ZOO, convert_request
from edge_runtime.errors import InputError
from edge_runtime.models.image import load_image_samples
from factories import png_bytes

DIGITS = ZOO / "digits-cnn"


def _convert(out, **kw):
    """The digits convert (onnx-int8, no probe set) with ``kw`` over the zoo request: the manifest's
    variant and the progress lines."""
    from edge_runtime.converters import pipeline

    lines: list[str] = []
    man = pipeline.convert(convert_request("digits-cnn", "image-classification", out,
                                           **{"probe_samples": 0, **kw}), lines.append)
    return man["variants"][0], lines


def _class_folders(root: Path, files: list[Path], n: int = 4) -> list[Path]:
    """``files`` dealt into ``n`` class folders under ``root`` (outside any calibration folder)."""
    out = []
    for k in range(n):
        d = root / f"c{k}"
        d.mkdir(parents=True)
        for f in files[k::n]:
            shutil.copy(f, d / f.name)
        out.append(d)
    return out


def _digits():
    return sorted((DIGITS / "calibration").glob("*.png"))


def test_symlinked_class_folders_are_calibrated_on(tmp_path):
    # before: calib/c2 -> /data/c2 and calib/c3 -> /data/c3 were not entered by Path.rglob: 100 of
    # the 200 digits were calibrated and split (75 + 25 recorded), exit 0, no word
    folders = _class_folders(tmp_path / "data", _digits())
    cal = tmp_path / "cal"
    cal.mkdir()
    shutil.move(str(folders[0]), cal / "c0")
    shutil.move(str(folders[1]), cal / "c1")
    for d in folders[2:]:
        os.symlink(d, cal / d.name, target_is_directory=True)
    assert len(load_image_samples(cal)) == 200
    v, lines = _convert(tmp_path / "a", calibration=cal, parity_data=None)
    assert v["quantization"]["calibration"]["samples"] == 150 and v["parity"]["samples"] == 50
    assert "left_out" not in v["quantization"]["calibration"]
    assert "--calibration: read 2 symlinked subfolders (each real folder once): c2/, c3/" in lines, lines


def test_a_folder_of_only_symlinked_class_folders_is_not_empty(tmp_path):
    # before: "no PNG/JPEG/BMP images under cal" (the common calib/cat -> /data/cat layout)
    cal = tmp_path / "cal"
    cal.mkdir()
    for d in _class_folders(tmp_path / "data", _digits()):
        os.symlink(d, cal / d.name, target_is_directory=True)
    v, _ = _convert(tmp_path / "a", calibration=cal, parity_data=None)
    assert v["quantization"]["calibration"]["samples"] == 150


def test_symlink_loops_and_repeated_folders_are_read_once_and_said(tmp_path):
    # a link back to the folder (or above it) and a second link to a folder read already: each real
    # folder is read once (no loop, no image twice), and what was not entered is in the record
    data = tmp_path / "data"
    folders = _class_folders(data / "classes", _digits())
    cal = data / "cal"
    cal.mkdir()
    for d in folders:
        os.symlink(d, cal / d.name, target_is_directory=True)
    os.symlink(cal, cal / "c1" / "back", target_is_directory=True)     # inside /data/classes/c1: a link to cal
    os.symlink(data, cal / "up", target_is_directory=True)             # a folder that holds cal
    os.symlink(folders[0], cal / "zz_again", target_is_directory=True)  # c0 a second time
    samples = load_image_samples(cal)
    assert len(samples) == 200
    v, lines = _convert(tmp_path / "a", calibration=cal, parity_data=None)
    rec = v["quantization"]["calibration"]
    assert rec["samples"] == 150 and v["parity"]["samples"] == 50
    assert "2 symlinked folders that loop left out: " in rec["left_out"]
    assert "zz_again/ (the same folder as c0/)" in rec["left_out"]
    assert "c1/back/ (a link to a folder that holds it)" in rec["left_out"]
    assert "up/ (a link to a folder that holds it)" in rec["left_out"]
    assert any(x.startswith("warning: --calibration: 2 symlinked folders that loop") for x in lines), lines


def test_undecodable_image_formats_are_counted_and_warned_of(tmp_path):
    # before: .webp/.gif/.tif beside the PNGs were skipped without a word
    cal = tmp_path / "cal"
    shutil.copytree(DIGITS / "calibration", cal)
    for name in ("a.webp", "b.GIF", "sub/c.tif", "sub/d.tiff"):
        (cal / name).parent.mkdir(exist_ok=True)
        (cal / name).write_bytes(b"not decoded")
    v, lines = _convert(tmp_path / "a", calibration=cal, parity_data=None)
    rec = v["quantization"]["calibration"]
    assert rec["samples"] == 150
    assert rec["left_out"] == ("4 files in an image format the runtime does not decode (PNG/JPEG/BMP only) left "
                               "out: a.webp, b.GIF, sub/c.tif, ... (1 more)")
    assert rec["left_out"] in v["parity"]["data"]
    assert any(x.startswith("warning: --calibration: 4 files in an image format") for x in lines), lines
    (cal / "sub" / "d.tiff").unlink()
    (cal / "IMG_0001.HEIC").write_bytes(b"not decoded")
    shutil.copy(_digits()[0], cal / "photo.jfif")                 # a JPEG's Windows suffix (a PNG here)
    samples = load_image_samples(cal)
    assert len(samples) == 200
    assert samples.left_out == [
        "4 files in an image format the runtime does not decode (PNG/JPEG/BMP only) left out: IMG_0001.HEIC, "
        "a.webp, b.GIF, ... (1 more)",
        "1 JPEG/BMP file under a suffix not read (rename it .jpg or .bmp) left out: photo.jfif"]


def test_a_folder_of_only_undecodable_images_is_a_typed_error_naming_them(tmp_path):
    # before: "cannot read samples (ValueError: no PNG/JPEG/BMP images under cal)": nothing said of
    # the 3 WebP/TIFF files it held
    cal = tmp_path / "cal"
    cal.mkdir()
    for name in ("x.webp", "y.tiff", "z.gif"):
        (cal / name).write_bytes(b"RIFF")
    with pytest.raises(InputError) as exc:
        load_image_samples(cal)
    assert exc.value.code == "convert_calibration_invalid"
    assert "3 files in an image format the runtime does not decode" in exc.value.message
    assert "x.webp, y.tiff, z.gif" in exc.value.message and "convert them" in exc.value.message
    with pytest.raises(InputError) as exc:
        _convert(tmp_path / "a", calibration=cal, parity_data=None)
    assert exc.value.code == "convert_calibration_invalid" and "x.webp" in exc.value.message


def test_parity_data_through_symlinked_class_folders(tmp_path):
    # before: --parity-data held/{0..9} -> elsewhere measured parity on the real folders only (or
    # failed with "no images"); and a .webp in it was skipped without a word
    held = sorted((DIGITS / "held_out").rglob("*.png"))[::9]          # 40 images
    real = tmp_path / "heldreal"
    par = tmp_path / "par"
    par.mkdir()
    for k, d in enumerate(_class_folders(real, held)):
        if k % 2:
            os.symlink(d, par / d.name, target_is_directory=True)
        else:
            shutil.move(str(d), par / d.name)
    (par / "c0" / "extra.webp").write_bytes(b"RIFF")
    v, lines = _convert(tmp_path / "a", parity_data=par)
    assert v["parity"]["samples"] == 40
    assert v["parity"]["data"] == ("par (40 samples; 1 file in an image format the runtime does not decode "
                                   "(PNG/JPEG/BMP only) left out: c0/extra.webp)")
    assert "left_out" not in v["quantization"]["calibration"]       # the calibration's record: its own folder
    assert any(x.startswith("--parity-data: read 2 symlinked subfolders") for x in lines), lines


def test_broken_links_and_unlistable_folders_are_said(tmp_path, monkeypatch):
    # before: a class folder linked to an unmounted disk, and a subfolder that cannot be listed
    # (Path.rglob drops a PermissionError), calibrated on the rest without a word
    cal = tmp_path / "cal"
    shutil.copytree(DIGITS / "calibration", cal)
    os.symlink(tmp_path / "gone", cal / "dog", target_is_directory=True)
    (cal / "secret").mkdir()
    shutil.copy(_digits()[0], cal / "secret" / "s.png")
    real_scandir = os.scandir

    def scandir(path="."):
        if Path(path).name == "secret":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    samples = load_image_samples(cal)
    assert len(samples) == 200
    assert samples.left_out == ["1 folder that cannot be listed left out: secret/", "1 broken symlink left out: dog"]


def test_a_fifo_named_like_an_image_does_not_block_the_read(tmp_path):
    # before: read_bytes() of cal/x.png, a FIFO, blocked forever (convert hung at "loading calibration")
    cal = tmp_path / "cal"
    cal.mkdir()
    for i in range(3):
        (cal / f"{i}.png").write_bytes(png_bytes(np.full((8, 8), i * 50, np.uint8)))
    fifo = cal / "x.png"
    os.mkfifo(fifo)
    got: list = []
    t = threading.Thread(target=lambda: got.append(load_image_samples(cal)), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():                     # unblock the reader before failing
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(5)
        pytest.fail("reading the calibration folder blocked on a FIFO")
    assert len(got[0]) == 3
    assert got[0].left_out == ["1 file that is no regular file left out: x.png"]


@pytest.mark.parametrize("shape, said", [((64, 64, 1), "one 64x64x1 image"), ((64, 64), "one 64x64 array")])
def test_a_one_image_grayscale_npy_is_not_read_as_rows(tmp_path, shape, said):
    # before: a 64x64x1 image saved with numpy.save calibrated as 64 "images" one pixel wide (64
    # calibration samples recorded, exit 0); a 64x64 one failed with "image arrays must be HxW..."
    rng = np.random.default_rng(0)
    np.save(tmp_path / "one.npy", rng.integers(0, 256, size=shape, dtype=np.uint8))
    for option in ("calibration", "parity_data"):
        with pytest.raises(InputError) as exc:
            _convert(tmp_path / "a", **{option: tmp_path / "one.npy"})
        assert exc.value.code == "convert_calibration_invalid"
        assert said in exc.value.message and "not a batch" in exc.value.message
        assert exc.value.message.startswith("--" + option.replace("_", "-"))
