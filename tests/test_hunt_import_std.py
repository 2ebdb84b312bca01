"""``edge-infer import --std -1`` was taken: a negative standard deviation inverts every pixel, and the
imported MobileNet called Coral's cat.bmp a "mosquito net" with exit 0 (``--preprocess`` JSON already refused
it: "every std must be > 0"). Now the import refuses it, as it refused 0."""

from __future__ import annotations

import pytest

import edge_runtime as er
from conftest import shared


def _import(tmp_path, *flags):
    """``edge-infer import`` of Coral's MobileNet v1 (uint8 input) into tmp_path/a with these flags."""
    from click.testing import CliRunner

    from edge_runtime.cli import main

    coral = shared("coral")
    return CliRunner().invoke(main, ["import", str(coral / "mobilenet_v1_0.25_128_quant.tflite"), "-o",
                                     str(tmp_path / "a"), "--task", "image-classification", "--labels",
                                     str(coral / "imagenet_labels.txt"), *flags])


@pytest.mark.parametrize("std", ["-1", "0.229,-0.224,0.225", "0"])
def test_a_non_positive_std_is_refused_at_import(tmp_path, std):
    r = _import(tmp_path, "--std", std)
    assert r.exit_code == 2 and "import_preprocess_invalid" in r.output and "--std must be positive" in r.output, \
        r.output
    assert not (tmp_path / "a" / "manifest.json").exists()


def test_the_stated_imagenet_std_still_imports_and_answers(tmp_path):
    r = _import(tmp_path, "--scale", "1/127.5", "--mean", "1", "--std", "1")
    assert r.exit_code == 0, r.output
    with er.load(tmp_path / "a", device="tflite") as rt:
        assert "cat" in rt.infer(str(shared("coral", "cat.bmp"))).prediction


def test_a_normalisation_that_leaves_one_step_is_refused_with_the_range_that_fits(tmp_path):
    # --scale 1/255 --mean 127.5 --std 127.5 (two conventions mixed): -1..-0.992, one of 255 steps. It imported
    # with a warning and every image was a "nematode", exit 0
    r = _import(tmp_path, "--scale", "1/255", "--mean", "127.5", "--std", "127.5")
    assert r.exit_code == 2 and "import_normalisation_collapses" in r.output, r.output
    assert "[-1, 1]" in r.output and not (tmp_path / "a" / "manifest.json").exists()
