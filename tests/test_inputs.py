"""Hostile inputs end in a typed InputError before any device work."""

import numpy as np
import pytest

import edge_runtime as er
from factories import png_bytes


@pytest.fixture
def text_rt(make_artifact):
    with er.load(make_artifact("text-classification"), device="fake") as rt:
        yield rt


@pytest.fixture
def image_rt(make_artifact):
    with er.load(make_artifact("image-classification"), device="fake") as rt:
        yield rt


def no_device_call(rt):
    return sum(s.info()["runs"] for s in rt._sessions)


@pytest.mark.parametrize("raw,code", [
    ("", "input_empty"),
    ("   \n\t", "input_empty"),
    ("x" * 10_001, "input_too_long"),
    (b"\xff\xfe bad utf8", "input_bad_encoding"),
    ("lone \ud800 surrogate", "input_bad_encoding"),
    (12345, "input_wrong_type"),
    (None, "input_wrong_type"),
    (["good"], "input_wrong_type"),
    ({"text": 5}, "input_wrong_type"),
])
def test_text_rejections(text_rt, raw, code):
    before = no_device_call(text_rt)
    with pytest.raises(er.InputError) as ei:
        text_rt.infer(raw)
    assert ei.value.code == code
    assert no_device_call(text_rt) == before


def test_text_limit_override_per_call_and_odd_unicode(text_rt):
    with pytest.raises(er.InputError):
        text_rt.infer("good movie", limits={"max_text_chars": 5})
    assert text_rt.infer("good movie 🎬 \u200b ñ").prediction in ("negative", "positive")
    with pytest.raises(er.InputError):
        text_rt.infer("good", limits={"max_text_chars": None})   # never unlimited by accident


def test_artifact_limits_override_defaults(make_artifact):
    with er.load(make_artifact("text-classification", limits={"max_text_chars": 20}), device="fake") as rt:
        assert rt.info()["limits"]["max_text_chars"] == 20
        with pytest.raises(er.InputError, match="over the limit of 20"):
            rt.infer("good " * 10)


def test_image_rejections(image_rt, tmp_path):
    ok = png_bytes(np.zeros((8, 8), np.uint8))
    cases = [
        (b"", "input_empty"),
        (b"GIF89a not an image", "input_undecodable"),
        (ok[: len(ok) // 2], "input_undecodable"),
        (np.zeros((8, 8), np.float32), "input_wrong_dtype"),
        (np.zeros((8, 8, 2), np.uint8), "input_wrong_shape"),
        (np.zeros((0, 8), np.uint8), "input_empty"),
        (str(tmp_path / "missing.png"), "input_file_unreadable"),
        (3.5, "input_wrong_type"),
    ]
    before = no_device_call(image_rt)
    for raw, code in cases:
        with pytest.raises(er.InputError) as ei:
            image_rt.infer(raw)
        assert ei.value.code == code, (raw if not isinstance(raw, bytes) else raw[:10], ei.value.code)
    assert no_device_call(image_rt) == before


def test_decompression_bomb_refused_from_header(image_rt):
    from PIL import Image
    import io

    # a 10000x10000 PNG compresses to a few hundred KB; refused before decoding
    buf = io.BytesIO()
    Image.new("L", (10_000, 5_000)).save(buf, format="PNG")
    with pytest.raises(er.InputError) as ei:
        image_rt.infer(buf.getvalue(), limits={"max_image_pixels": 10_000_000})
    assert ei.value.code == "input_too_many_pixels"


def test_oversized_encoded_image(image_rt):
    with pytest.raises(er.InputError) as ei:
        image_rt.infer(b"\x89PNG" + b"0" * 2048, limits={"max_image_bytes": 1024})
    assert ei.value.code == "input_too_large"
    with pytest.raises(er.InputError) as ei:
        image_rt.infer(b"0" * (33 * 1024 * 1024))
    assert ei.value.code == "input_too_large"   # over an image task's 32 MiB request limit


def test_an_image_task_takes_camera_frames_and_photos_by_default(image_rt, text_rt):
    """A 1080p RGB frame is 5.9 MiB and a phone photo 3-5 MB: the generic 2 MiB request limit
    refused both (a 720p frame too); image tasks default to 32 MiB, text keeps 2 MiB, and a
    manifest or a caller still lowers it."""
    assert image_rt.limits.max_request_bytes == 32 << 20 and text_rt.limits.max_request_bytes == 2 << 20
    assert image_rt.infer(np.zeros((1080, 1920, 3), np.uint8)).prediction is not None
    with pytest.raises(er.InputError) as ei:
        image_rt.infer(np.zeros((1080, 1920, 3), np.uint8), limits={"max_request_bytes": 2 << 20})
    assert ei.value.code == "input_too_large"


def test_images_in_every_form_agree(image_rt, tmp_path):
    arr = (np.arange(64, dtype=np.uint8).reshape(8, 8) * 4)
    data = png_bytes(arr)
    (tmp_path / "d.png").write_bytes(data)
    a = image_rt.infer(arr)
    b = image_rt.infer(data)
    c = image_rt.infer(str(tmp_path / "d.png"))
    d = image_rt.infer(np.stack([arr] * 3, axis=-1))  # RGB converted to L
    assert a.scores == b.scores == c.scores
    assert a.prediction == d.prediction


def test_tensor_rejections(make_artifact):
    with er.load(make_artifact("tensors"), device="fake") as rt:
        good = {"x": np.ones((1, 4), np.float32), "k": np.ones((1, 2), np.int32)}
        assert rt.infer(good).outputs["y"].shape == (1, 3)
        assert rt.infer({"x": [1, 2, 3, 4], "k": [1, 2]}).outputs["y"].shape == (1, 3)  # batch added
        bad = [
            ({"x": np.ones((1, 4), np.float32)}, "input_wrong_names"),
            ({"x": np.full((1, 4), np.nan, np.float32), "k": good["k"]}, "input_nonfinite"),
            ({"x": np.full((1, 4), np.inf, np.float32), "k": good["k"]}, "input_nonfinite"),
            ({"x": np.ones((1, 5), np.float32), "k": good["k"]}, "input_wrong_shape"),
            ({"x": good["x"], "k": np.ones((1, 2), np.float32)}, "input_wrong_dtype"),
            ({"x": [[1, 2], [3]], "k": good["k"]}, "input_wrong_type"),
            ({"x": "abcd", "k": good["k"]}, "input_wrong_type"),
            ({"x": good["x"], "k": [2**40, 1]}, "input_out_of_range"),
            # an integer array of a wider dtype is range-checked like a list, never wrapped by the cast
            ({"x": good["x"], "k": np.array([[2**40, 1]], np.int64)}, "input_out_of_range"),
            ({"x": good["x"], "k": np.array([[2**31, 1]], np.uint32)}, "input_out_of_range"),
            ([1, 2, 3], "input_wrong_type"),
        ]
        for raw, code in bad:
            with pytest.raises(er.InputError) as ei:
                rt.infer(raw)
            assert ei.value.code == code, (raw, ei.value.message)
        # in range, a wider integer array is cast to the same values as the model's own dtype
        wide = rt.infer({"x": good["x"], "k": np.array([[7, -3]], np.int64)}).outputs["y"]
        assert np.array_equal(wide, rt.infer({"x": good["x"], "k": np.array([[7, -3]], np.int32)}).outputs["y"])


def test_batch_limits_and_per_item_errors(text_rt):
    res = text_rt.infer_batch(["good movie", "", "bad", 7])
    assert [type(r).__name__ for r in res] == ["InferenceResult", "InputError", "InferenceResult", "InputError"]
    with pytest.raises(er.InputError) as ei:
        text_rt.infer_batch(["good"] * 501)
    assert ei.value.code == "input_batch_too_large"
    with pytest.raises(er.InputError):
        text_rt.infer_batch("good")
    with pytest.raises(er.InputError):
        text_rt.infer_batch(["x" * 9000] * 300)   # > 2 MiB in total


def test_deep_json_is_refused_by_the_cli_reader(tmp_path):
    from edge_runtime.cli_inputs import _read_json_input

    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(er.InputError) as ei:
        _read_json_input(str(p))
    assert ei.value.code == "input_too_deep"
    p.write_text('{"text": "ok"')
    with pytest.raises(er.InputError):
        _read_json_input(str(p))
    # brackets inside a string are text: neither nesting that refuses a short valid input, nor
    # closers that hid the real depth from the scan (json's RecursionError escaped untyped)
    p.write_text('{"inputs": "' + "[" * 40 + '\\"[{"}')
    assert _read_json_input(str(p)) == "[" * 40 + '"[{'
    p.write_text('["' + "]" * 100_000 + '", ' + "[" * 50_000 + "]" * 50_000 + "]")
    with pytest.raises(er.InputError) as ei:
        _read_json_input(str(p))
    assert ei.value.code == "input_too_deep"
