"""shadow's text summary shows a pose prediction (the mean keypoint score, a float) rounded, as every
other figure on that line is: it printed ``A 0.23593058941118858``."""

from __future__ import annotations

import re

import numpy as np

from output_cases import cli_shadow


def test_the_worst_lines_show_a_pose_prediction_rounded(make_artifact, tmp_path):
    from PIL import Image

    a = make_artifact("pose-estimation", seed=0)
    b = make_artifact("pose-estimation", seed=5)
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    rng = np.random.default_rng(1)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(imgs / f"{i}.png")
    res = cli_shadow(a, b, imgs, "--device-a", "fake", "--device-b", "fake", "--output", tmp_path / "o.jsonl")
    worst = [line for line in res.output.splitlines() if re.match(r"\s+\[\d+\]", line)]
    assert worst, res.output
    for line in worst:
        for number in re.findall(r"[AB] (\d\.\d+)", line):
            assert len(number) <= 6, line       # 4 significant digits: 0.2359
