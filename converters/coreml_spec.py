"""Static validation of a built Core ML ``.mlpackage`` (runs on Linux: no prediction).

Loads the spec (``MLModel(skip_model_load=True)``) and checks, against what the
artifact's task contract says:

- an ML program (``mlProgram``), one ``main`` function;
- inputs and outputs: the same names, static shapes equal to the contract's,
  dtypes Core ML can carry for them (float32 → FLOAT32; int64/int32 token ids
  → INT32, cast by the backend; outputs FLOAT32 or FLOAT16);
- op types (recorded as a histogram);
- weights really are int8: every weight operand of conv / conv_transpose /
  linear / matmul / gather (embeddings) comes from a ``constexpr_affine_dequantize``
  or ``constexpr_blockwise_shift_scale`` op whose data is INT8/UINT8 in the
  program *and* in the weight blob's own header (``weights/weight.bin``: each
  blob's metadata records its storage dtype and byte size), so a package whose
  program claims int8 over float bytes is refused too;
- for ``w8a8``: activations are quantized (``quantize`` ops with int8/uint8
  output feeding ``dequantize``) in front of every conv/linear, but exactly the
  number the recipe keeps float (``float_inputs``; named in the record).

``validate`` returns the report recorded in the variant and raises
``SpecInvalid`` (a ``ConversionFailed``) naming what does not hold.
"""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

from .registry import ConversionFailed

WEIGHT_OPS = {"conv": ("weight",), "conv_transpose": ("weight",), "linear": ("weight",), "matmul": ("x", "y"),
              "gather": ("x",), "embedding": ("weight",)}
INT8_CONSTEXPR = {"constexpr_affine_dequantize": "quantized_data", "constexpr_blockwise_shift_scale": "data"}
_BLOB_SENTINEL = 0xDEADBEEF
_BLOB_DTYPES = {1: "float16", 2: "float32", 3: "uint8", 4: "int8", 5: "bfloat16", 6: "int16", 7: "uint16"}
# contract dtype -> Core ML multi-array dtypes accepted for it
IO_DTYPES = {"float32": ("FLOAT32",), "float16": ("FLOAT16",), "int32": ("INT32",), "int64": ("INT32",)}
OUT_DTYPES = {"float32": ("FLOAT32", "FLOAT16"), "float16": ("FLOAT16",), "int32": ("INT32",)}


class SpecInvalid(ConversionFailed):
    """The built .mlpackage does not hold what the artifact would claim."""


def _io(spec, contract: list[dict], allowed: dict, kind: str, problems: list) -> dict:
    from coremltools.proto import FeatureTypes_pb2 as ft

    got = {f.name: f for f in (spec.description.input if kind == "input" else spec.description.output)}
    want = [t["name"] for t in contract]
    if list(got) != want:
        problems.append(f"{kind}s {list(got)} differ from the contract's {want}")
    dtypes = {}
    for t in contract:
        f = got.get(t["name"])
        if f is None:
            continue
        if f.type.WhichOneof("Type") != "multiArrayType":
            problems.append(f"{kind} {t['name']!r} is a {f.type.WhichOneof('Type')}, not a multi-array")
            continue
        arr = f.type.multiArrayType
        shape = [int(d) for d in arr.shape]
        if arr.WhichOneof("ShapeFlexibility") is not None or shape != list(t["shape"]):
            problems.append(f"{kind} {t['name']!r} has shape {shape} (flexible: "
                            f"{arr.WhichOneof('ShapeFlexibility') is not None}), the contract {t['shape']}")
        dt = ft.ArrayFeatureType.ArrayDataType.Name(arr.dataType)
        if dt not in allowed.get(t["dtype"], ()):
            problems.append(f"{kind} {t['name']!r} is {dt} in the model; the contract's {t['dtype']} needs "
                            f"{' or '.join(allowed.get(t['dtype'], ('?',)))}")
        dtypes[t["name"]] = dt.lower()
    return dtypes


def _blob(root: Path, value, cache: dict) -> tuple[str, int] | None:
    """(storage dtype, bytes) from the blob's header in the weight file, None if not in a blob."""
    if value.WhichOneof("value") != "blobFileValue":
        return None
    b = value.blobFileValue
    rel = b.fileName.replace("@model_path/", "")
    path = root / "Data" / "com.apple.CoreML" / rel
    if ".." in Path(rel).parts or not path.is_file() or path.is_symlink():
        raise SpecInvalid(f"weight blob file {b.fileName!r} is missing or outside the package")
    if path not in cache:
        cache[path] = path.read_bytes()
    data = cache[path]
    if b.offset + 24 > len(data):
        raise SpecInvalid(f"weight blob offset {b.offset} is past the end of {rel}")
    sentinel, dtype, size, offset = struct.unpack_from("<IIQQ", data, b.offset)
    if sentinel != _BLOB_SENTINEL or offset + size > len(data):
        raise SpecInvalid(f"weight blob at offset {b.offset} of {rel} has no valid header")
    return _BLOB_DTYPES.get(dtype, f"code{dtype}"), int(size)


def validate(package: Path, inputs: list[dict], outputs: list[dict], mode: str, float_inputs: int = 0) -> dict:
    """``float_inputs``: w8a8 conv/linear the recipe keeps with float inputs (int8 weights still)."""
    import coremltools as ct
    from coremltools.proto import MIL_pb2

    package = Path(package)
    try:
        spec = ct.models.MLModel(str(package), skip_model_load=True).get_spec()
    except Exception as exc:  # noqa: BLE001 - any load failure means "not a valid package"
        raise SpecInvalid(f"the .mlpackage spec does not load: {type(exc).__name__}: {exc}") from None
    problems: list[str] = []
    if spec.WhichOneof("Type") != "mlProgram":
        raise SpecInvalid(f"not an ML program (model type {spec.WhichOneof('Type')})")
    in_dtypes = _io(spec, inputs, IO_DTYPES, "input", problems)
    out_dtypes = _io(spec, outputs, OUT_DTYPES, "output", problems)
    funcs = spec.mlProgram.functions
    if "main" not in funcs:
        raise SpecInvalid("the ML program has no main function")
    fn = funcs["main"]
    ops = list(fn.block_specializations[fn.opset].operations)
    if any(len(op.blocks) for op in ops):
        problems.append("the program has nested blocks (control flow)")
    producer = {o.name: op for op in ops for o in op.outputs}
    histogram = Counter(op.type for op in ops)
    blobs: dict = {}
    int8_tensors = int8_elements = float_tensors = float_elements = 0
    float_weights = []

    def dtype_of(value) -> str:
        return MIL_pb2.DataType.Name(value.type.tensorType.dataType).lower()

    for op in ops:                                     # every constant in a blob: what it is stored as
        if op.type in INT8_CONSTEXPR:
            data = op.attributes.get(INT8_CONSTEXPR[op.type])
            declared = dtype_of(data) if data is not None else "missing"
            stored = _blob(package, data, blobs) if data is not None else None
            n = stored[1] if stored else 0
            if declared not in ("int8", "uint8") or (stored and stored[0] not in ("int8", "uint8")):
                problems.append(f"{op.type} {op.outputs[0].name!r}: data is {declared} in the program, "
                                f"{stored[0] if stored else 'inline'} in the weight file")
            else:
                int8_tensors += 1
                int8_elements += n
        elif op.type == "const" and "val" in op.attributes:
            stored = _blob(package, op.attributes["val"], blobs)
            if stored and stored[0] in ("float16", "float32", "bfloat16"):
                float_tensors += 1
                float_elements += stored[1] // (2 if stored[0] != "float32" else 4)

    for op in ops:                                     # every weight operand comes from an int8 constexpr
        for arg in WEIGHT_OPS.get(op.type, ()):
            if arg not in op.inputs:
                continue
            for a in op.inputs[arg].arguments:
                src = producer.get(a.name)
                if src is None or src.type not in ("const", *INT8_CONSTEXPR):
                    continue                           # an activation, not a weight
                if src.type == "const":
                    stored = _blob(package, src.attributes["val"], blobs) if "val" in src.attributes else None
                    if stored is not None or op.type != "gather":   # gather indices may be small inline consts
                        float_weights.append(f"{op.type}.{arg} <- {src.outputs[0].name}")
    if float_weights:
        problems.append(f"{len(float_weights)} weight operand(s) are not int8: {', '.join(float_weights[:5])}")
    if int8_tensors == 0:
        problems.append("no int8 weights at all")
    activation = {}
    if mode == "w8a8":
        quant_out = {op.outputs[0].name for op in ops if op.type == "quantize"
                     and dtype_of(op.outputs[0]) in ("int8", "uint8")}
        int8_vars = {o.name for op in ops for o in op.outputs if dtype_of(o) in ("int8", "uint8")}
        # dequantize of an int8 activation (a quantize output, possibly reshaped while int8)
        deq_of_q = {op.outputs[0].name for op in ops if op.type == "dequantize"
                    and all(a.name in int8_vars and producer[a.name].type not in INT8_CONSTEXPR
                            for a in op.inputs["input"].arguments)}
        compute = [op for op in ops if op.type in ("conv", "linear")]
        fed = [op for op in compute if all(a.name in deq_of_q for a in op.inputs["x"].arguments)]
        activation = {"quantize_ops": len(quant_out), "quantized_inputs": f"{len(fed)}/{len(compute)} conv/linear",
                      **({"float_inputs_by_recipe": float_inputs} if float_inputs else {})}
        if not quant_out or len(fed) != len(compute) - float_inputs:
            problems.append(f"w8a8 without int8 activations in front of every conv/linear"
                            f"{' but the recipe float ones' if float_inputs else ''} ({activation})")
    elif histogram.get("quantize"):
        problems.append(f"mode {mode} but the program quantizes activations ({histogram['quantize']} quantize ops)")
    report = {
        "spec_loaded": "coremltools MLModel(skip_model_load=True)", "model_type": "mlProgram", "opset": fn.opset,
        "specification_version": int(spec.specificationVersion), "inputs": in_dtypes, "outputs": out_dtypes,
        "op_counts": dict(sorted(histogram.items())),
        "int8_weight_tensors": int8_tensors, "int8_weight_elements": int8_elements,
        "float_constant_tensors": float_tensors, "float_constant_elements": float_elements,
        **({"activations": activation} if activation else {}),
        "passed": not problems,
    }
    if problems:
        raise SpecInvalid("Core ML spec validation failed: " + "; ".join(problems))
    return report
