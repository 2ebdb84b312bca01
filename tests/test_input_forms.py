"""Inputs in the forms users hand them: a JSON file with a BOM, a multi-dimensional memoryview."""

import json

import numpy as np

import edge_runtime as er


def test_an_input_json_file_with_a_bom_is_read_as_text_files_are(tmp_path):
    # Notepad saves UTF-8 with a BOM; --text-file dropped it, --input refused it as input_bad_json
    from edge_runtime.cli_inputs import _read_json_input

    p = tmp_path / "in.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"inputs": ["good movie", "bad"]}).encode())
    assert _read_json_input(str(p)) == ["good movie", "bad"]


def test_a_memoryview_is_sized_in_bytes_for_the_request_limit():
    # len() of a 2-D memoryview is its row count: a 1000x1000 view counted 1000 bytes
    from edge_runtime.models.base import Task

    view = memoryview(np.zeros((1000, 1000), np.uint8))
    assert Task.request_bytes(None, view) == 1_000_000
    assert Task.request_bytes(None, memoryview(b"abc")) == 3


def test_a_2d_memoryview_over_the_limit_is_refused(make_artifact, tmp_path):
    art = make_artifact("image-classification")
    with er.load(art, device="fake", warmup=False, limits={"max_request_bytes": 4096}) as rt:
        try:
            rt.infer(memoryview(np.zeros((100, 100), np.uint8)))
        except er.InputError as exc:
            assert exc.code == "input_too_large", exc
        else:
            raise AssertionError("a 10,000-byte memoryview passed a 4,096-byte request limit")
