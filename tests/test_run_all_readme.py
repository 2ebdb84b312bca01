"""``python bench/run_all.py`` writes one table to ``bench/results/ratios.md`` and into README's
marked block: the splice replaces that block only, and the committed README holds the same rows
as the committed ``ratios.md`` (they come from one run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run_all():
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "bench" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_splice_replaces_only_the_marked_block_and_is_idempotent():
    ra = _run_all()
    readme = f"# T\n\nintro\n\n{ra.BEGIN}\nold table\n{ra.END}\n\n## Next\nkept | not a row\n"
    table = "# Ratios (2026-12-06)\n\nRegenerated on 2026-12-06 ...\n\n| a | b |\n|---|---|\n| x | 1 |\n"
    out = ra.splice_readme(readme, table)
    assert out is not None and "old table" not in out and "# Ratios" not in out
    assert out.startswith("# T\n\nintro\n\n") and out.endswith(f"{ra.END}\n\n## Next\nkept | not a row\n")
    assert "| x | 1 |" in out and ra.splice_readme(out, table) == out
    assert ra.splice_readme("no markers here", table) is None
    assert ra.splice_readme(f"{ra.END}\n{ra.BEGIN}", table) is None                  # out of order
    assert ra.splice_readme(f"{ra.BEGIN}{ra.END}{ra.BEGIN}{ra.END}", table) is None  # twice


def test_readme_block_holds_the_rows_of_ratios_md():
    ra = _run_all()
    readme = (ROOT / "README.md").read_text()
    assert readme.count(ra.BEGIN) == 1 and readme.count(ra.END) == 1
    block = readme.split(ra.BEGIN, 1)[1].split(ra.END, 1)[0]
    rows = _table_lines((ROOT / "bench" / "results" / "ratios.md").read_text())
    assert len(rows) > 10 and _table_lines(block) == rows
    assert "AMD EPYC" in block or "Xeon" in block            # the CPU is named
