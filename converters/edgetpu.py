"""The ``edgetpu`` target: the full-int8 TFLite model compiled by ``edgetpu_compiler``.

Only when the compiler is on PATH. The compiler's exit code is checked, its
log parsed (ops on the Edge TPU vs the CPU, subgraphs, on/off-chip memory),
and its output accepted only if it exists and holds an ``edgetpu-custom-op``:
a file the compiler did not finish is never shipped, and an uncompiled model
is never labelled ``edgetpu``. Without the compiler the pipeline says so and
builds the ``tflite-int8`` variant (which carries the static Edge TPU report)
instead.

Parity: a compiled model runs only on an Edge TPU, which a build machine
usually lacks, so it is measured on the uncompiled int8 model the compiler
was given (the TPU executes those same int8 ops) and recorded as such.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

from .base import BucketBuild, BuildContext, Converter
from .registry import ConversionFailed
from .tflite_int8 import TfliteInt8Converter, describe

COMPILER = "edgetpu_compiler"
_LOG_FIELDS = {
    "tpu_ops": r"Number of operations that will run on Edge TPU:\s*(\d+)",
    "cpu_ops": r"Number of operations that will run on CPU:\s*(\d+)",
    "subgraphs": r"Number of Edge TPU subgraphs:\s*(\d+)",
    "on_chip_memory": r"On-chip memory used for caching model parameters:\s*([\d.]+\s*\w+)",
    "off_chip_memory": r"Off-chip memory used for streaming uncached model parameters:\s*([\d.]+\s*\w+)",
    "compiler_version": r"Edge TPU Compiler version\s*([\w.\-]+)",
}


def parse_log(text: str) -> dict:
    out = {}
    for key, pattern in _LOG_FIELDS.items():
        m = re.search(pattern, text)
        if m:
            out[key] = int(m.group(1)) if m.group(1).isdigit() else m.group(1)
    # per-op table: "OPNAME   count   Mapped to Edge TPU" / "... Operation is otherwise supported, but not mapped";
    # custom ops keep their own spelling (TFLite_Detection_PostProcess left on the CPU is a row too)
    ops = []
    in_table = False
    for line in text.splitlines():
        line = line.strip()
        if re.match(r"^Operator\s+Count\s+Status$", line):
            in_table = True
            continue
        pattern = r"^([A-Za-z][\w\-]*)\s+(\d+)\s+(.+?)$" if in_table else r"^([A-Z][A-Z0-9_]+)\s+(\d+)\s+(.+?)$"
        m = re.match(pattern, line)
        if m:
            ops.append({"op": m.group(1), "count": int(m.group(2)), "status": m.group(3)})
    if ops:
        out["ops"] = ops
    return out


REPORT_KEYS = ("fully_mappable", "tpu_ops", "cpu_ops", "first_unsupported", "tpu_parameter_bytes",
               "exceeds_on_chip_memory", "verdict")


def compiled_edgetpu_report(path: Path) -> dict:
    """The Edge TPU report of a compiled model (its ``edgetpu-custom-op`` segments and the ops left on the
    CPU), in the keys the ``tflite-int8`` variant records, plus ``cpu_op_types``."""
    from .edgetpu_report import edgetpu_report
    from .tflite_inspect import inspect_tflite

    rep = edgetpu_report(inspect_tflite(path))
    out = {k: rep[k] for k in REPORT_KEYS}
    out["edgetpu_compiled"] = rep["edgetpu_compiled"]
    out["cpu_op_types"] = {k: v["cpu"] for k, v in rep["split"].items() if v["cpu"]}
    return out


class EdgeTpuConverter(Converter):
    target = "edgetpu"
    suffix = "_edgetpu.tflite"
    recipes = ("full-int8",)
    fallback_target = "tflite-int8"

    def __init__(self, compiler: str | None = None, timeout_s: int = 900):
        self.compiler = compiler
        self.timeout_s = timeout_s

    def _compiler(self) -> str | None:
        return self.compiler or shutil.which(COMPILER)

    def unavailable(self) -> str | None:
        return None if self._compiler() else (f"{COMPILER} is not on PATH (it is not installable here); only "
                                              f"the {self.fallback_target} variant is built, with the static "
                                              "Edge TPU compatibility report")

    def default_recipe(self, task: str) -> str:
        return "full-int8"

    def build_bucket(self, fp32_path: Path, out_path: Path, calibration_feeds: list[dict],
                     ctx: BuildContext) -> BucketBuild:
        from edge_runtime.devices.tflite_backend import is_edgetpu_model

        from .onnx_io import io_specs

        compiler = self._compiler()
        if not compiler:
            raise ValueError(self.unavailable())
        work = Path(ctx.work) / f"edgetpu_{Path(out_path).stem}"
        work.mkdir(parents=True, exist_ok=True)
        plain = work / "model.tflite"
        built = TfliteInt8Converter().build_bucket(fp32_path, plain, calibration_feeds,
                                                   dataclasses.replace(ctx, recipe="full-int8"))
        info = dict(built.quantization)
        try:
            proc = subprocess.run([compiler, "-s", "-o", str(work), str(plain)], capture_output=True, text=True,
                                  timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise ConversionFailed(f"{COMPILER} did not finish within {self.timeout_s} s") from None
        log = proc.stdout + proc.stderr
        compiled = work / "model_edgetpu.tflite"
        if proc.returncode != 0:
            raise ConversionFailed(f"{COMPILER} failed (exit {proc.returncode}): {log.strip()[-400:]}")
        if not compiled.is_file() or compiled.stat().st_size == 0 or not is_edgetpu_model(compiled):
            raise ConversionFailed(f"{COMPILER} exited 0 but wrote no compiled model (no edgetpu-custom-op in "
                             f"{compiled.name}); refusing to label it edgetpu")
        shutil.copyfile(compiled, out_path)
        parsed = parse_log(log)
        if parsed.get("tpu_ops") == 0:
            raise ConversionFailed(f"{COMPILER} mapped no operation to the Edge TPU: {log.strip()[-400:]}")
        info.update(scheme="tflite-full-integer compiled for the Edge TPU", compiler=parsed,
                    compiler_log=log[-4000:])
        # what runs where is the compiled model's: the static report of the int8 model given to the compiler
        # is an estimate the compiler may contradict (YOLOv8n: "fully mappable", compiled with 24 CPU ops);
        # it is kept as such, and the variant's report is read from the file that ships
        compiled_report = compiled_edgetpu_report(Path(out_path))
        if "edgetpu_report" in info:
            info["edgetpu_estimate"] = info.pop("edgetpu_report")
        info["edgetpu_report"] = compiled_report
        ins, outs, names = describe(Path(out_path), *io_specs(fp32_path))
        return BucketBuild(info, inputs=ins, outputs=outs, parity_model=plain, fields={"tensor_names": names})

    def toolchain(self) -> dict:
        tc = TfliteInt8Converter().toolchain()
        try:
            # not on PATH: running the bare name fails, and the version is "?"
            out = subprocess.run([self._compiler() or COMPILER, "--version"], capture_output=True, text=True, timeout=30)
            tc["edgetpu_compiler"] = (out.stdout or out.stderr).strip().splitlines()[0] if out.returncode == 0 else "?"
        except Exception:  # noqa: BLE001
            tc["edgetpu_compiler"] = "?"
        return tc
