"""The real photos of ../shared/data as detection calibration and parity sets (issue #18).

Parity is measured on the 11 colour photos themselves (the 5 detection photos and 6 of
Coral's test photos); calibration uses 55 images derived from the same 11 photos: each
one flipped left-right, and two crops (the left 70 % and the lower-right 70 %) of it, each
also flipped. No parity photo is a calibration image, though they share their scenes:
there are not more real colour photos in the data.
"""

from __future__ import annotations

from pathlib import Path

from conftest import shared

PHOTOS = [("detection", "images", n) for n in ("bus.jpg", "zidane.jpg", "dog.jpg", "person.jpg", "street.jpg")] + \
         [("coral", n) for n in ("cat.bmp", "parrot.jpg", "bird.bmp", "squat.bmp", "grace_hopper.bmp",
                                 "bird_segmentation.bmp")]


def photo_paths() -> list[Path]:
    return [shared(*p) for p in PHOTOS]


def build_sets(root: Path) -> tuple[Path, Path]:
    """``(calibration folder, parity folder)`` under ``root``."""
    from PIL import Image, ImageOps

    calib, parity = root / "calibration", root / "parity"
    calib.mkdir(parents=True, exist_ok=True)
    parity.mkdir(parents=True, exist_ok=True)
    for i, path in enumerate(photo_paths()):
        img = Image.open(path).convert("RGB")
        img.save(parity / f"{i:02d}.png")
        w, h = img.size
        crops = [img.crop((0, 0, int(w * 0.7), int(h * 0.7))), img.crop((int(w * 0.3), int(h * 0.3), w, h))]
        for j, im in enumerate([ImageOps.mirror(img)] + crops + [ImageOps.mirror(c) for c in crops]):
            im.save(calib / f"{i:02d}_{j}.png")
    return calib, parity
