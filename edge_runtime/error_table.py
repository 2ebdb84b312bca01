"""README's "Error codes" table from the codes registry (``ec.CODES``): one row a code, in
registration order. ``python -m edge_runtime.error_table`` prints it; ``tests/test_error_codes.py``
checks that README's table is this one."""

from __future__ import annotations

import sys

from . import error_codes as ec


def markdown() -> str:
    """README's table: ``| code | layer | exit | meaning |``, one row a code."""
    rows = ["| code | layer | exit | meaning |", "| --- | --- | --- | --- |"]
    rows += [f"| `{c.code}` | {' / '.join(c.layers)} | {' / '.join(map(str, c.exits))} | {c.meaning} |"
             for c in ec.CODES.values()]
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:] not in ([], ["--markdown"]):
        sys.exit("usage: python -m edge_runtime.error_table")
    print(markdown())
