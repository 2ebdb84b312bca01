"""A minimal .tflite flatbuffer writer for tests (the ``tflite`` schema package): hand-built
models with exactly the tensors, ops, shapes and quantization a test needs."""

import importlib

import flatbuffers
import numpy as np

F32, I32, U8, I8 = 0, 2, 3, 9

_Buf, _Model, _Op, _Code, _SubGraph, _Tensor, _Quant = (
    importlib.import_module(f"tflite.{m}")
    for m in ("Buffer", "Model", "Operator", "OperatorCode", "SubGraph", "Tensor", "QuantizationParameters"))


def build_model(tensors, ops, inputs, outputs, buffers, *, offset_buffers=False, alias=False):
    """A minimal .tflite: tensors = [(name, type, shape, sig|None, buffer_idx[, (scales, zero_points, axis)])],
    ops = [(code, custom, ins, outs)], buffers = [bytes] (index 0 must be b""); ``alias`` shares equal op
    input/output vectors (a hostile trick)."""
    def once(offsets):
        b = flatbuffers.Builder(1024)
        codes = []
        for code, custom, _, _ in ops:
            if (code, custom) not in codes:
                codes.append((code, custom))
        code_offs = []
        for code, custom in codes:
            cs = b.CreateString(custom) if custom else None
            _Code.Start(b)
            _Code.AddDeprecatedBuiltinCode(b, min(code, 127))
            _Code.AddBuiltinCode(b, code)
            _Code.AddVersion(b, 1)
            if cs is not None:
                _Code.AddCustomCode(b, cs)
            code_offs.append(_Code.End(b))
        t_offs = []
        for name, ttype, shape, sig, bidx, *q in tensors:
            n = b.CreateString(name)
            sh = b.CreateNumpyVector(np.array(shape, dtype=np.int32))
            sg = b.CreateNumpyVector(np.array(sig, dtype=np.int32)) if sig is not None else None
            qo = _quantization(b, *q[0]) if q and q[0] is not None else None
            _Tensor.Start(b)
            _Tensor.AddShape(b, sh)
            if sg is not None:
                _Tensor.AddShapeSignature(b, sg)
            _Tensor.AddType(b, ttype)
            _Tensor.AddBuffer(b, bidx)
            _Tensor.AddName(b, n)
            if qo is not None:
                _Tensor.AddQuantization(b, qo)
            t_offs.append(_Tensor.End(b))
        o_offs, shared_vecs = [], {}

        def ivec(xs):
            if not alias:
                return b.CreateNumpyVector(np.array(xs, dtype=np.int32))
            if tuple(xs) not in shared_vecs:
                shared_vecs[tuple(xs)] = b.CreateNumpyVector(np.array(xs, dtype=np.int32))
            return shared_vecs[tuple(xs)]

        for code, custom, ins, outs in ops:
            iv, ov = ivec(ins), ivec(outs)
            _Op.Start(b)
            _Op.AddOpcodeIndex(b, codes.index((code, custom)))
            _Op.AddInputs(b, iv)
            _Op.AddOutputs(b, ov)
            o_offs.append(_Op.End(b))

        def vec(start, items):
            start(b, len(items))
            for x in reversed(items):
                b.PrependUOffsetTRelative(x)
            return b.EndVector()

        tv = vec(_SubGraph.StartTensorsVector, t_offs)
        ov = vec(_SubGraph.StartOperatorsVector, o_offs)
        iv = b.CreateNumpyVector(np.array(inputs, dtype=np.int32))
        outv = b.CreateNumpyVector(np.array(outputs, dtype=np.int32))
        _SubGraph.Start(b)
        _SubGraph.AddTensors(b, tv)
        _SubGraph.AddInputs(b, iv)
        _SubGraph.AddOutputs(b, outv)
        _SubGraph.AddOperators(b, ov)
        sgo = _SubGraph.End(b)
        b_offs = []
        for k, data in enumerate(buffers):
            d = b.CreateNumpyVector(np.frombuffer(data, dtype=np.uint8)) if data and not offset_buffers else None
            _Buf.Start(b)
            if d is not None:
                _Buf.AddData(b, d)
            elif data:
                _Buf.AddOffset(b, offsets[k])
                _Buf.AddSize(b, len(data))
            b_offs.append(_Buf.End(b))
        cv = vec(_Model.StartOperatorCodesVector, code_offs)
        sv = vec(_Model.StartSubgraphsVector, [sgo])
        bv = vec(_Model.StartBuffersVector, b_offs)
        _Model.Start(b)
        _Model.AddVersion(b, 3)
        _Model.AddOperatorCodes(b, cv)
        _Model.AddSubgraphs(b, sv)
        _Model.AddBuffers(b, bv)
        b.Finish(_Model.End(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    if not offset_buffers:
        return once(None)
    head = once([1] * len(buffers))  # same layout, placeholder offsets
    pos, offsets, tail = (len(head) + 15) // 16 * 16, [], b""
    for data in buffers:
        offsets.append(pos + len(tail) if data else 0)
        tail += data + b"\0" * (-len(data) % 16)
    out = once(offsets)
    assert len(out) == len(head)
    return out + b"\0" * (pos - len(out)) + tail


def _quantization(b, scales, zero_points, axis):
    sv = b.CreateNumpyVector(np.array(scales, dtype=np.float32))
    zv = b.CreateNumpyVector(np.array(zero_points, dtype=np.int64))
    _Quant.Start(b)
    _Quant.AddScale(b, sv)
    _Quant.AddZeroPoint(b, zv)
    _Quant.AddQuantizedDimension(b, axis)
    return _Quant.End(b)
