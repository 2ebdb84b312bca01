import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
ZOO = ROOT / "models" / "zoo"
CACHE = Path(os.environ.get("EDGE_RUNTIME_TEST_CACHE", ROOT / "tests" / ".cache"))

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def make_artifact(tmp_path):
    from factories import make_artifact as mk

    counter = iter(range(1000))

    def build(task="text-classification", **kw):
        return mk(tmp_path / f"art{next(counter)}", task, **kw)

    return build


@pytest.fixture(scope="session")
def digits_artifact(tmp_path_factory):
    """digits-cnn converted to onnx-int8 through the real pipeline (~10 s)."""
    from edge_runtime.converters.pipeline import ConvertRequest, convert
    import json

    out = tmp_path_factory.mktemp("digits") / "digits-int8"
    zoo = ZOO / "digits-cnn"
    convert(ConvertRequest(source=zoo / "model.onnx", out=out, task="image-classification", targets=["onnx-int8"],
                           calibration=zoo / "calibration", parity_data=zoo / "held_out", labels=zoo / "labels.txt",
                           preprocess=json.loads((zoo / "preprocess.json").read_text()), name="digits-cnn"))
    return out


def shared(*parts) -> Path:
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"shared test data {p} is absent")
    return p
