"""Error codes live in one place (issue #16 item 7): ``edge_runtime/error_codes.py``.

Read by AST over the package (edge_runtime/, devices/, models/, converters/; a
symlinked folder is not walked twice): no code is a string literal at a raise
site, in a class default, a dict, a comparison or a helper's argument; every
``ec.NAME`` exists; every entry of ``CODES`` is used; its layer is the class it
is raised with wherever that is visible; and README's table is ``CODES``.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from edge_runtime import error_codes as ec
from edge_runtime import error_table
from edge_runtime import errors

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("edge_runtime", "devices", "models", "converters")
CODES_FILE = "edge_runtime/error_codes.py"
# the plain word "unknown" where it is not an error code (a signal, a device, a package name)
NOT_CODES = {("edge_runtime/isolate_process.py", "unknown"), ("devices/openvino_backend.py", "unknown"),
             ("devices/tflite_backend.py", "unknown"),
             ("edge_runtime/host.py", "unknown")}   # an int8 class, not an error code


def _package_files() -> dict[str, ast.Module]:
    out = {}
    for top in PACKAGE_DIRS:
        for dirpath, dirnames, filenames in os.walk(ROOT / top):     # followlinks=False: the symlinks are skipped
            dirnames[:] = sorted(d for d in dirnames if not (Path(dirpath) / d).is_symlink())
            for name in sorted(filenames):
                if name.endswith(".py"):
                    path = Path(dirpath) / name
                    out[path.relative_to(ROOT).as_posix()] = ast.parse(path.read_text(encoding="utf-8"))
    return out


FILES = _package_files()


def _docstrings(tree) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _strings(node) -> list[ast.Constant]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _results(node):
    """The expressions ``node`` can evaluate to (both sides of ``a if c else b``, each of ``a or b``)."""
    if isinstance(node, ast.IfExp):
        yield from _results(node.body)
        yield from _results(node.orelse)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _results(value)
    else:
        yield node


def _literals(node) -> list[ast.Constant]:
    return [n for n in _results(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _class_code_values(cls: ast.ClassDef):
    for st in cls.body:
        targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, ast.AnnAssign) else []
        if getattr(st, "value", None) is not None and any(isinstance(t, ast.Name) and t.id == "code" for t in targets):
            yield st


def _ec_names(node) -> list[str]:
    return [n.attr for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "ec"]


def _where(rel, node) -> str:
    return f"{rel}:{node.lineno}"


def _code_slots(tree):
    """(where it is, the expression) for each place that takes a code: ``code=``, a class's ``code =``,
    a ``{"code": ...}`` entry, a parameter ``code``'s default."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield from (("code=", kw.value) for kw in node.keywords if kw.arg == "code")
        elif isinstance(node, ast.ClassDef):
            yield from ((f"class {node.name}: code =", st.value) for st in _class_code_values(node))
        elif isinstance(node, ast.Dict):
            yield from (("{'code':}", v) for k, v in zip(node.keys, node.values)
                        if isinstance(k, ast.Constant) and k.value == "code")
        elif isinstance(node, ast.arguments):
            params = node.posonlyargs + node.args
            defaults = [None] * (len(params) - len(node.defaults)) + node.defaults
            yield from (("parameter code=", d) for a, d in list(zip(params, defaults))
                        + list(zip(node.kwonlyargs, node.kw_defaults)) if a.arg == "code" and d is not None)


def test_no_code_is_a_string_literal():
    bad = []
    for rel, tree in FILES.items():
        if rel == CODES_FILE:
            continue
        seen = set()
        for what, expr in _code_slots(tree):           # any literal there, a known code or not
            for lit in _literals(expr):
                seen.add(id(lit))
                bad.append(f"{_where(rel, lit)}: {what} {lit.value!r}")
        docs = _docstrings(tree)                      # and a known code anywhere else (helpers, comparisons)
        bad += [f"{_where(rel, s)}: {s.value!r} (use ec.{s.value.upper()})" for s in _strings(tree)
                if s.value in ec.CODES and id(s) not in docs | seen and (rel, s.value) not in NOT_CODES]
    assert not bad, "error codes written as literals:\n" + "\n".join(sorted(bad))


def test_error_codes_are_imported_as_ec():
    bad = []
    for rel, tree in FILES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names_from_it = (node.module or "").split(".")[-1] == "error_codes"
                if names_from_it or any(a.name == "error_codes" and a.asname != "ec" for a in node.names):
                    bad.append(f"{_where(rel, node)}: import error_codes as `ec` (the checks read ec.NAME)")
            elif isinstance(node, ast.Import):
                bad += [f"{_where(rel, node)}: import {a.name}" for a in node.names if a.name.endswith("error_codes")]
    assert not bad, "\n".join(bad)


def test_every_ec_name_exists_and_every_code_is_used():
    used: dict[str, list[str]] = {}
    for rel, tree in FILES.items():
        if rel != CODES_FILE:
            for node in ast.walk(tree):
                for name in _ec_names(node) if isinstance(node, ast.Attribute) else ():
                    used.setdefault(name, []).append(_where(rel, node))
    missing = {name: where for name, where in used.items() if not hasattr(ec, name)}
    assert not missing, f"ec names that do not exist: {missing}"
    dead = sorted(code for code in ec.CODES if code.upper() not in used)
    assert not dead, f"codes in CODES that the package never raises or names: {dead}"


def test_constant_names_are_the_upper_cased_codes():
    constants = {name: v for name, v in vars(ec).items() if name.isupper() and isinstance(v, str)}
    assert {name: v for name, v in constants.items() if name != v.upper() or v not in ec.CODES} == {}
    assert sorted(constants.values()) == sorted(ec.CODES)
    for code, entry in ec.CODES.items():
        assert entry.code == code and entry.layer in ec.LAYERS and set(entry.also) <= set(ec.LAYERS) - {entry.layer}
        assert entry.meaning and "|" not in entry.meaning and entry.meaning != code


def _error_classes() -> dict[str, type]:
    import edge_runtime.converters.registry  # noqa: F401 - define their subclasses
    import edge_runtime.models  # noqa: F401

    found, todo = {}, [errors.EdgeRuntimeError]
    while todo:
        cls = todo.pop()
        assert found.setdefault(cls.__name__, cls) is cls, f"two error classes named {cls.__name__}"
        todo += cls.__subclasses__()
    return found


def _layer_of(cls: type) -> str:
    by_exit = {exit_code: layer for layer, exit_code in ec.LAYERS.items()}
    return by_exit[cls.exit_code]


def test_layer_exit_codes_are_the_error_classes():
    assert len(set(ec.LAYERS.values())) == len(ec.LAYERS)
    bases = {"input": errors.InputError, "artifact": errors.ArtifactError, "device": errors.DeviceError,
             "timeout": errors.InferenceTimeout, "runtime": errors.InferenceRuntimeError,
             "parity": errors.ParityError, "other": errors.EdgeRuntimeError}
    assert {layer: cls.exit_code for layer, cls in bases.items()} == ec.LAYERS
    for name, cls in _error_classes().items():     # a subclass counts as its base
        base = next(b for b in cls.__mro__ if b in bases.values())
        assert _layer_of(cls) == _layer_of(base), name
        assert ec.CODES[cls.code].layer == _layer_of(cls), f"{name}.code = {cls.code!r}"


def _sites(classes):
    """(where, class name, ec names) wherever the class a code is raised with is written out."""
    for rel, tree in FILES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if fn in classes:
                    for kw in node.keywords:
                        if kw.arg == "code":
                            yield _where(rel, node), fn, _ec_names(kw.value)
            elif isinstance(node, ast.ClassDef) and node.name in classes:
                for st in _class_code_values(node):
                    yield _where(rel, st), node.name, _ec_names(st.value)
            elif isinstance(node, ast.Dict):
                d = {k.value: v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)}
                kind = d.get("type")
                if "code" in d and isinstance(kind, ast.Constant) and kind.value in classes:
                    yield _where(rel, node), kind.value, _ec_names(d["code"])


def test_each_code_is_raised_with_its_layer():
    classes = _error_classes()
    seen, bad = set(), []
    for where, cls_name, names in _sites(classes):
        layer = _layer_of(classes[cls_name])
        for name in names:
            seen.add(name)
            if ec.CODES[getattr(ec, name)].layer != layer:
                bad.append(f"{where}: {cls_name}(code=ec.{name}) is {layer}, CODES says "
                           f"{ec.CODES[getattr(ec, name)].layer}")
    assert not bad, "\n".join(bad)
    assert len(seen) > 100, f"only {len(seen)} codes were checked against a raise site"


_ROW = re.compile(r"^\|\s*`([a-z0-9_]+)`\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|\s*$")


def _rows(text: str) -> dict[str, tuple[str, str, str]]:
    out = {}
    for line in text.splitlines():
        m = _ROW.match(line)
        if m:
            assert m[1] not in out, f"{m[1]} is listed twice"
            out[m[1]] = (m[2], m[3], m[4])
    return out


def test_readme_lists_every_code():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^## Error codes\n(.*?)(?=^## )", readme, re.S | re.M)
    assert m, "README.md has no '## Error codes' section"
    ours, theirs = _rows(error_table.markdown()), _rows(m[1])
    assert len(ours) == len(ec.CODES)
    assert sorted(set(ours) - set(theirs)) == [], "codes missing from README (python -m edge_runtime.error_codes " \
                                                  "--markdown prints the table)"
    assert sorted(set(theirs) - set(ours)) == [], "codes in README that CODES does not have"
    for code, row in ours.items():
        assert theirs[code] == row, f"README's row for {code}: {theirs[code]}, CODES: {row}"
    for code, (layer, exit_code, _) in theirs.items():
        assert layer.split(" / ") == list(ec.CODES[code].layers)
        assert [int(x) for x in exit_code.split(" / ")] == list(ec.CODES[code].exits)


def test_error_codes_imports_nothing_from_the_project():
    tree = ast.parse((ROOT / CODES_FILE).read_text(encoding="utf-8"))
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "." for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert all(not name.startswith(("edge_runtime", ".")) and name.split(".")[0] not in PACKAGE_DIRS
               for name in imported), imported
