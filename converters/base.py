"""The converter seam: what the pipeline asks of a target's converter, declared once.

A converter turns one fp32 ONNX bucket (static dims, fixed by the pipeline)
into the target's int8 model. :class:`Converter` declares every member the
pipeline (``pipeline``, ``build_variant``, ``request``, ``parity_trials``)
uses, with the default a plain target wants; a converter overrides
``build_bucket`` and ``toolchain`` and whatever else its target differs in.
``build_bucket`` gets a :class:`BuildContext` and returns a :class:`BucketBuild`.

A new converter is one file and one entry point in the
``edge_runtime.converters`` group (see :mod:`.registry`). Stdlib-only at
import time: the CLI imports this module before any toolchain.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class BuildContext:
    """What one bucket's build is given besides its paths and calibration feeds."""
    task: str                          # the task name ("image-classification", ...)
    work: Path                         # scratch directory of this convert (deleted after it)
    recipe: str | None = None          # the recipe asked for this target (None: the converter's default)
    overrides: dict | None = None      # --recipe-override, as given (the converter checks the keys)
    task_obj: object = None            # the task over this one bucket (its pre/post-processing, parity metric)
    prepared: tuple = ()               # the calibration samples prepared by task_obj (feeds + what finish needs)
    budget: float | None = None        # the parity budget this target is gated on
    torch_source: Path | None = None   # a PyTorch twin of the source (coreml converts from torch)


@dataclass(frozen=True)
class BucketIO:
    """A built bucket model's tensors and the companion files next to it."""
    inputs: list
    outputs: list
    extra_files: tuple = ()            # paths beside the model the runtime also reads (OpenVINO's .bin)


@dataclass(frozen=True)
class BucketBuild:
    """The typed record of one bucket's build.

    ``quantization`` is the variant's quantization record (the first bucket's is
    kept). ``inputs``/``outputs`` name the model's tensors when the converter
    knows them (None: the pipeline asks ``describe``). ``entry`` is the file
    inside a package directory that the bucket's ``file`` names (Core ML's
    ``Manifest.json``). ``parity_model`` is a model of ``fallback_target`` that
    parity is measured on instead (the Edge TPU's uncompiled int8 model).
    ``extra_files`` are companion files beside the model, hashed into the
    artifact. ``fields`` are further per-bucket manifest fields, written as given.
    """
    quantization: dict
    inputs: list | None = None
    outputs: list | None = None
    entry: str | None = None
    parity_model: Path | None = None
    extra_files: tuple = ()
    fields: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RecipeTrial:
    """One candidate of ``--recipe auto``: a recipe name (None: the converter's default), the
    overrides it runs with, and why it is in the list (recorded with its figures)."""
    recipe: str | None
    overrides: dict = field(default_factory=dict)
    why: str = ""


@dataclass(frozen=True)
class ParityStandIn:
    """Sessions that stand in for a target that cannot run here, and what they are."""
    sessions: list
    label: str


class Converter(abc.ABC):
    """One target's converter. Class attributes and methods, each with its default."""

    target: str = ""                       # the variant's target name
    suffix: str = ".onnx"                  # bucket model file suffix (".xml", ".mlpackage", ...)
    fallback_target: str | None = None     # built instead when this one is skipped (--allow-skip)
    quantizes: bool = True                 # False: a float target (onnx-fp32), calibration unused

    @property
    def recipes(self) -> tuple[str, ...]:
        """Recipe names --recipe may pick (empty: any is passed through); a subclass sets a
        class attribute, or a property that imports its recipe table only when asked."""
        return ()

    def unavailable(self) -> str | None:
        """Why this host cannot build the target (its toolchain is missing), else None."""
        return None

    def parity_unavailable(self) -> str | None:
        """Why this host cannot run the built model to measure parity, else None."""
        return None

    def runtime_candidates(self) -> list[dict]:
        """Runtime option sets to measure parity and speed with (the fastest within budget is kept)."""
        return [{}]

    def parity_stand_in(self, buckets: list[dict]) -> ParityStandIn | None:
        """Where ``parity_unavailable``: sessions to measure parity on instead, else None (not measured)."""
        return None

    def default_recipe(self, task: str) -> str | None:
        """The recipe used when none is asked for."""
        return None

    def auto_recipes(self, task: str) -> list[RecipeTrial]:
        """``--recipe auto``'s candidates, fastest first, safest last; the first that meets the
        parity budget is kept. A list holds only recipes whose parity does not depend on which
        CPU runs them (no int8 arithmetic that saturates on one ISA and not on another)."""
        return [RecipeTrial(None, {}, "the converter's default")]

    def describe(self, path: Path) -> BucketIO:
        """The tensors of a built bucket model whose build did not name them (an ONNX model here)."""
        from .onnx_io import io_specs

        ins, outs = io_specs(path)
        return BucketIO(ins, outs)

    @abc.abstractmethod
    def build_bucket(self, fp32_path: Path, out_path: Path, calibration_feeds: list[dict],
                     ctx: BuildContext) -> BucketBuild:
        """Build ``out_path`` (a file, or a package directory) from the fp32 bucket model.
        A ValueError is a bad recipe/override; ``ConversionFailed``: the toolchain cannot build it."""

    @abc.abstractmethod
    def toolchain(self) -> dict:
        """Versions of the toolchain that built the variant (recorded in the manifest)."""
