"""Read-only JSON: what a parsed, validated manifest becomes (#16 item 6).

``freeze(obj)`` turns parsed JSON into ``FrozenDict``/``FrozenList``: subclasses of
dict and list, so reading, equality (``spec["shape"] == [1, 3]``), ``json.dumps``
and ``isinstance(x, dict)`` behave exactly as before, while every mutation raises
``TypeError`` naming the record. Nothing the runtime reads from an artifact can be
changed after validation, by the runtime, a backend or a task. ``thaw(obj)`` gives
plain, mutable copies (converters and tests that derive a new manifest).
"""

from __future__ import annotations

from typing import Any, NoReturn


def _refuse(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(f"{type(self).__name__} is read-only: a validated manifest is never changed "
                    "(thaw() it to derive a new one)")


class FrozenDict(dict):
    """A dict that refuses every mutation (hashable by identity only: it stays a dict)."""

    __slots__ = ()
    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __copy__(self) -> dict:
        return dict(self)

    def __deepcopy__(self, memo: dict) -> dict:
        return thaw(self)

    def __reduce__(self):            # pickles (and copies) as a plain dict: the receiver owns it
        return (dict, (thaw(self),))


class FrozenList(list):
    """A list that refuses every mutation."""

    __slots__ = ()
    __setitem__ = __delitem__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __iadd__ = __imul__ = _refuse

    def __copy__(self) -> list:
        return list(self)

    def __deepcopy__(self, memo: dict) -> list:
        return thaw(self)

    def __reduce__(self):
        return (list, (thaw(self),))


def freeze(obj: Any) -> Any:
    """Parsed JSON -> the same structure, read-only all the way down."""
    if isinstance(obj, FrozenDict | FrozenList):
        return obj
    if isinstance(obj, dict):
        frozen = FrozenDict.__new__(FrozenDict)
        dict.update(frozen, {k: freeze(v) for k, v in obj.items()})
        return frozen
    if isinstance(obj, list | tuple):
        frozen_l = FrozenList.__new__(FrozenList)
        list.extend(frozen_l, (freeze(v) for v in obj))
        return frozen_l
    return obj


def thaw(obj: Any) -> Any:
    """A plain, mutable deep copy of (possibly frozen) JSON."""
    if isinstance(obj, dict):
        return {k: thaw(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [thaw(v) for v in obj]
    return obj
