"""``convert --recipe auto``: a target's ``auto_recipes`` tried fastest first, the first whose
parity meets the budget kept, and every trial's figures recorded in the variant
(``recipe_trials``). Each trial builds into the same place; a refused trial's files are
discarded before the next one is built, so only the kept recipe's files are hashed."""

from __future__ import annotations

import time

from edge_runtime import error_codes as ec
from edge_runtime.errors import InputError, ParityError

from .base import Converter
from .build_variant import Built, Job, Samples, build_target, variant_record
from .parity_trials import Reference


def build_auto(job: Job, target: str, converter: Converter, samples: Samples, reference: Reference,
               budget: float, progress) -> dict:
    rows: list[dict] = []
    kept: tuple[dict, Built] | None = None     # (its row, the build) of the recipe kept
    last: tuple[dict, Built] | None = None     # the last recipe that built (its files are in place)
    measured_under: tuple[dict, Built] | None = None   # the last one measured, its files discarded since
    candidates = converter.auto_recipes(job.req.task)
    for k, trial in enumerate(candidates):
        overrides = {**trial.overrides, **(job.req.recipe_overrides or {})}   # the caller's overrides win
        if any(r.get("recipe") == trial.recipe and r["overrides"] == overrides for r in rows):
            continue    # the default recipe was this one already
        progress(f"{target}: recipe auto {k + 1}/{len(candidates)}: {trial.recipe or 'default'}"
                 + (f" {overrides}" if overrides else "") + (f" ({trial.why})" if trial.why else ""))
        job.writer.discard(target)
        t0 = time.perf_counter()
        row: dict = {"recipe": trial.recipe, "overrides": overrides, "why": trial.why}
        rows.append(row)
        try:
            built = build_target(job, converter, target, samples, reference, trial.recipe, overrides or None,
                                 budget, progress)
        except InputError as exc:   # the toolchain cannot build this recipe: the next one may
            if exc.code not in (ec.CONVERT_TARGET_FAILED, ec.CONVERT_RECIPE_INVALID):
                raise
            row.update(error=exc.message, seconds=round(time.perf_counter() - t0, 1))
            if last is not None:        # its files are gone: what it measured is kept for the refusal
                measured_under = last
            last = None
            continue
        par = built.measured.parity
        row.update(recipe=built.quant.get("recipe", trial.recipe), parity=par.get("value"), min=par.get("min"),
                   budget=budget, device_ms_median=par.get("device_ms_median"), passed=par.get("passed"),
                   seconds=round(time.perf_counter() - t0, 1), **({"not_judged": par["not_judged"]}
                                                                   if par.get("not_judged") else {}))
        last = (row, built)
        if par.get("passed") is not False:   # met the budget, or cannot be judged on this host
            kept = last
            break
    chosen = kept or last
    if chosen is None and measured_under is not None:
        # a trial was built and measured under budget, and every later one failed to build: the
        # convert is refused on that figure (exit 7, every trial's figures), not as "no recipe could be
        # built" (it was; a KeyError on its row, exit 1, before)
        row, built = measured_under
        row["kept"] = True
        par = built.measured.parity
        raise ParityError(f"parity under budget: {target}: {par['metric']} {par['value']:.4f} < budget "
                          f"{par['budget']} (recipe auto: no recipe met it; the later ones could not be built)",
                          variants=[{"target": target, "parity": par, "recipe_trials": rows}])
    if chosen is None:
        raise InputError(f"{target}: recipe auto: no recipe could be built: "
                         + "; ".join(f"{r['recipe'] or 'default'}: {r.get('error')}" for r in rows),
                         code=ec.CONVERT_TARGET_FAILED)
    row, built = chosen
    row["kept"] = True
    if kept is None:
        why = "no recipe met the parity budget: the last one built is recorded and the convert refused"
    elif row["passed"] is None and row.get("not_judged"):
        why = "parity cannot be judged (it compares nothing): the first recipe that built is kept unjudged"
    elif row["passed"] is None:
        why = "parity cannot be measured here: the first recipe that built is kept unjudged"
    else:
        why = "the first recipe (fastest first) that met the parity budget"
    built.quant["recipe_auto"] = {"kept": row["recipe"], "trials": len(rows), "why": why}
    variant = variant_record(target, converter, built, samples)
    variant["recipe_trials"] = rows
    return variant
