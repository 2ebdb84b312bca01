"""Build, on the x86 host with the project's own converters, the artifacts the
aarch64 run loads: digits onnx-int8, digits tflite-int8, digits openvino (when
the host has nncf) and Coral's MobileNetV2 imported with ``edge-infer import``.

    python ci/aarch64/build_artifacts.py OUT_DIR

Reuses OUT_DIR when its ``.key`` matches the hash of the sources that shape an
artifact (KEYED); writes ``index.json`` (name ->
device to run it on).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORAL = ROOT.parent / "shared" / "data" / "coral"


# what shapes an artifact's bytes: the converters, the tasks and zoo, the writer and the manifest format
# (the rest of edge_runtime changes often and does not; the aarch64 run loads them with the current code)
KEYED = ("converters", "models", "edge_runtime/artifact.py", "edge_runtime/manifest.py")


def source_key() -> str:
    h = hashlib.sha256()
    h.update(b"coral" if (CORAL / "mobilenet_v2_1.0_224_quant.tflite").exists() else b"no coral")
    for top in KEYED:
        for p in sorted([ROOT / top] if (ROOT / top).is_file() else (ROOT / top).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(ROOT)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def build(out: Path) -> dict:
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    index: dict[str, dict] = {}
    out.mkdir(parents=True, exist_ok=True)
    index["digits-onnx-int8"] = {"device": "onnxruntime", "inputs": "digits"}
    convert(convert_request("digits-cnn", "image-classification", out / "digits-onnx-int8", targets=["onnx-int8"]))
    index["digits-tflite-int8"] = {"device": "tflite", "inputs": "digits"}
    convert(convert_request("digits-cnn", "image-classification", out / "digits-tflite-int8", targets=["tflite-int8"]))
    if importlib.util.find_spec("nncf") and importlib.util.find_spec("openvino"):
        index["digits-openvino"] = {"device": "openvino", "inputs": "digits"}
        convert(convert_request("digits-cnn", "image-classification", out / "digits-openvino", targets=["openvino"]))
    # Coral's MobileNetV2, imported through the CLI the way a user would (when ../shared/data is there)
    if not (CORAL / "mobilenet_v2_1.0_224_quant.tflite").exists():
        print(f"aarch64: {CORAL} is absent: no Coral artifact", file=sys.stderr)
        return index
    exe = Path(sys.executable).with_name("edge-infer")
    subprocess.run([str(exe), "import", str(CORAL / "mobilenet_v2_1.0_224_quant.tflite"), "-o",
                    str(out / "coral-mnv2"), "--labels", str(CORAL / "imagenet_labels.txt")], check=True,
                   stdout=subprocess.DEVNULL)
    index["coral-mnv2"] = {"device": "tflite", "inputs": "coral"}
    return index


def main() -> int:
    out = Path(sys.argv[1])
    key = source_key()
    if (out / ".key").exists() and (out / ".key").read_text() == key and (out / "index.json").exists():
        print(f"aarch64: host artifacts reused ({out})", file=sys.stderr)
        return 0
    shutil.rmtree(out, ignore_errors=True)
    index = build(out)
    (out / "index.json").write_text(json.dumps(index, indent=1))
    (out / ".key").write_text(key)
    print(f"aarch64: host artifacts built: {', '.join(index)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
