"""Typed, frozen records of a validated manifest (#16 item 6).

``manifest.parse()`` builds these at their places in the read-only JSON tree:
``Manifest`` (the top), each ``Variant``, ``Bucket`` and ``TensorSpec``. They
are ``FrozenDict`` subclasses, so every reader of the JSON keeps working and
nothing can be changed, and they add typed attributes that new code (and the
type checker) reads instead of string subscripts:
``variant.buckets[0].inputs[0].shape``. Validation (``manifest.validate``) has
already checked every field these attributes read.
"""

from __future__ import annotations

from typing import Any, cast

from .frozen import FrozenDict, FrozenList, freeze


class TensorSpec(FrozenDict):
    """One model input or output: ``name``, ``dtype`` (numpy name), static ``shape``;
    ``quantization`` (``{"scale", "zero_point"}``) where the tensor is quantized."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return cast(str, self["name"])

    @property
    def dtype(self) -> str:
        return cast(str, self["dtype"])

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self["shape"])

    @property
    def quantization(self) -> FrozenDict | None:
        return cast("FrozenDict | None", self.get("quantization"))


class Bucket(FrozenDict):
    """One static-shape model file of a variant: ``name`` (``static``, ``seq64``...), ``file``, tensors."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return cast(str, self["name"])

    @property
    def file(self) -> str:
        return cast(str, self["file"])

    @property
    def inputs(self) -> list[TensorSpec]:
        return cast("list[TensorSpec]", self["inputs"])

    @property
    def outputs(self) -> list[TensorSpec]:
        return cast("list[TensorSpec]", self["outputs"])

    @property
    def extra_files(self) -> list[str]:
        return cast("list[str]", self.get("extra_files", []))


class Variant(FrozenDict):
    """One target's build: ``target``, its buckets, the recorded runtime options, parity and toolchain."""

    __slots__ = ()

    @property
    def target(self) -> str:
        return cast(str, self["target"])

    @property
    def buckets(self) -> list[Bucket]:
        return cast("list[Bucket]", self["buckets"])

    @property
    def runtime(self) -> FrozenDict:
        return cast(FrozenDict, self.get("runtime") or FrozenDict())

    @property
    def parity(self) -> FrozenDict:
        return cast(FrozenDict, self["parity"])

    @property
    def quantization(self) -> FrozenDict:
        return cast(FrozenDict, self["quantization"])


class Manifest(FrozenDict):
    """The whole validated manifest."""

    __slots__ = ()

    @property
    def task(self) -> str:
        return cast(str, self["task"])

    @property
    def name(self) -> str:
        return cast(str, self["model"]["name"])

    @property
    def version(self) -> str:
        return cast(str, self["model"]["version"])

    @property
    def variants(self) -> list[Variant]:
        return cast("list[Variant]", self["variants"])

    @property
    def files(self) -> FrozenDict:
        return cast(FrozenDict, self["files"])

    @property
    def preprocess(self) -> FrozenDict:
        return cast(FrozenDict, self["preprocess"])

    @property
    def postprocess(self) -> FrozenDict:
        return cast(FrozenDict, self["postprocess"])


def _as(cls: type[FrozenDict], obj: Any) -> Any:
    rec = cls.__new__(cls)
    dict.update(rec, freeze(obj))
    return rec


def _list(items: Any) -> FrozenList:
    out = FrozenList.__new__(FrozenList)
    list.extend(out, items)
    return out


def _bucket(b: dict) -> Bucket:
    body = dict(b)
    body["inputs"] = _list(_as(TensorSpec, t) for t in b["inputs"])
    body["outputs"] = _list(_as(TensorSpec, t) for t in b["outputs"])
    return cast(Bucket, _as(Bucket, body))


def _variant(v: dict) -> Variant:
    body = dict(v)
    body["buckets"] = _list(_bucket(b) for b in v["buckets"])
    return cast(Variant, _as(Variant, body))


def build(data: dict) -> Manifest:
    """Validated manifest JSON -> the typed, read-only records (the JSON is not changed)."""
    body = dict(data)
    body["variants"] = _list(_variant(v) for v in data["variants"])
    return cast(Manifest, _as(Manifest, body))


class CpuInfo(FrozenDict):
    """The host CPU: ``vendor``, ``model``, ``cores``, ISA ``features``, ``int8_dot`` (VNNI/AMX/dotprod:
    int8 dot products without int16 saturation)."""

    __slots__ = ()

    @property
    def vendor(self) -> str | None:
        return cast("str | None", self.get("vendor"))

    @property
    def model(self) -> str | None:
        return cast("str | None", self.get("model"))

    @property
    def cores(self) -> int | None:
        return cast("int | None", self.get("cores"))

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(self.get("features") or ())

    @property
    def int8_dot(self) -> bool:
        return bool(self.get("int8_dot"))


class Hardware(FrozenDict):
    """What ``hardware.detect()`` found, read-only and typed (the JSON keys stay readable as before)."""

    __slots__ = ()

    @property
    def system(self) -> str:
        return cast(str, self.get("system", ""))

    @property
    def machine(self) -> str:
        return cast(str, self.get("machine", ""))

    @property
    def cpu(self) -> CpuInfo:
        return cast(CpuInfo, self.get("cpu") or _as(CpuInfo, {}))

    @property
    def packages(self) -> FrozenDict:
        return cast(FrozenDict, self.get("packages") or FrozenDict())

    @property
    def apple_silicon(self) -> bool:
        return bool(self.get("apple_silicon"))

    @property
    def jetson(self) -> FrozenDict | None:
        return cast("FrozenDict | None", self.get("jetson"))

    @property
    def nvidia_gpus(self) -> list:
        return cast(list, self.get("nvidia_gpus") or [])

    @property
    def edgetpus(self) -> list:
        return cast(list, self.get("edgetpus") or [])


def hardware(found: dict) -> Hardware:
    """A probe's findings -> the typed, read-only hardware record."""
    body = dict(found)
    if isinstance(found.get("cpu"), dict):
        body["cpu"] = _as(CpuInfo, found["cpu"])
    return cast(Hardware, _as(Hardware, body))
