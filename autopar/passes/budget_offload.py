"""The memory-budget search's third lever (autopar.passes.budget_search): offloading parameters
and optimizer state to host memory (autopar.passes.offload), tried on the layouts the search
solved, and weighed against fitting on the device alone by step time."""
from __future__ import annotations

import dataclasses
import math

from autopar.ir.program import STEP
from autopar.passes.base import PassContext
from autopar.passes.budget_layout import Layout
from autopar.passes.collectives import find_redistributions
from autopar.passes.offload import best_offload, host_bytes_of_everything
from autopar.passes.recompute import Fit, fit
from autopar.units import human_bytes


class OffloadLever:
    def __init__(self, search):  # search: autopar.passes.budget_search.BudgetSearch
        self.search = search

    def best(self, chosen: Layout | None) -> Layout | None:
        """The fastest offload among the layouts tried (the fastest, the search's pick ``chosen``
        with its recomputation, the leanest), or None: with offload off, for a forward alone, or
        (offload "auto") where the fastest layout fits as it is."""
        search = self.search
        request = search.ctx.request
        if request.offload is False or search.graph.kind != STEP:
            return None
        fastest = search.fastest
        if request.offload == "auto" and fastest is not None and fastest.fit.plain.peak_bytes <= search.budget:
            return None
        # the fastest and the leanest layouts are tried without their own recomputation
        layouts = [Layout(fastest.result) if fastest is not None else None, chosen, Layout(search.lean.result)]
        # offload only adds to a layout's step: one no faster than the device-only pick cannot win
        # (with offload=True something must be offloaded, so every layout is tried)
        to_beat = chosen.step_s if chosen is not None and request.offload is not True else math.inf
        best, seen = None, set()
        for layout in filter(None, layouts):
            key = (tuple(layout.result.choice), layout.fit is not None)
            if key in seen or _before_offload_s(layout) >= min(to_beat, best.step_s if best else math.inf):
                continue
            seen.add(key)
            found = self.offload(layout)
            if found is not None and (best is None or found.step_s < best.step_s):
                best = found
        return best

    def offload(self, layout: Layout) -> Layout | None:
        """The fastest offload of ``layout``'s solution, with the recomputation of its fit on the
        device where it has one, or None. Where its activations leave too little room beside
        even one chunk, recomputation for the least memory comes with it (with
        recompute="auto"): offload frees the parameters' and optimizer state's room,
        recomputation the activations'."""
        search = self.search
        ctx = search.ctx
        result, fitted = layout.result, layout.fit
        strategies = search.problem.choice_of(result.choice)
        moves = find_redistributions(search.program, strategies, ctx.cost, ctx.request.precision)
        recompute = fitted.recompute if fitted is not None else None
        found = best_offload(search.graph, strategies, moves, ctx, search.budget,
                             recompute.variables if recompute is not None else (),
                             recompute.seconds if recompute is not None else 0.0)
        if found is None and ctx.request.recompute == "auto" and fitted is None:
            least = fit(search.graph, strategies, moves, ctx, math.inf, "full").recompute
            if least is not None and least.variables:
                found = best_offload(search.graph, strategies, moves, ctx, search.budget, least.variables,
                                     least.seconds)
        if found is None:
            return None
        plain = fitted.plain if fitted is not None else \
            fit(search.graph, strategies, moves, ctx, search.budget, "none").plain
        return Layout(result, Fit(plain, found))


def _before_offload_s(layout: Layout) -> float:
    """A layout's step before offload adds to it: its solved step, and the recomputation its fit
    keeps (offload keeps it too: the pick ``chosen``, fitted by recomputing, is no faster offloaded)."""
    recompute = layout.fit.recompute if layout.fit is not None else None
    return layout.result.objective + (recompute.seconds if recompute is not None else 0.0)


def because(chosen: Layout, why: str, ctx: PassContext) -> Layout:
    """``chosen`` (its fit with offload), its offload's reason starting with ``why``."""
    fitted = chosen.fit
    offload = fitted.recompute.offload
    ctx.report(f"offloading to host memory: {why}")
    offload = dataclasses.replace(offload, reason=f"offloaded because {why}; {offload.reason}")
    return Layout(chosen.result, dataclasses.replace(fitted, recompute=dataclasses.replace(fitted.recompute,
                                                                                           offload=offload)))


def offload_limits(search) -> str:
    """Why offloading found no plan: the host's memory, or what stays on the device."""
    hw, ctx = search.ctx.cost.hardware, search.ctx
    leanest = search.problem.choice_of(search.lean.result.choice)
    needed = host_bytes_of_everything(search.graph, leanest, ctx.mesh, ctx.request.optimizer)
    if needed > hw.host_memory_per_device:
        share, node = human_bytes(hw.host_memory_per_device), human_bytes(hw.host_memory_bytes)
        return (f"offloading every parameter of the leanest layout takes {human_bytes(needed)} of host memory per "
                f"device, over its share of {share} ({node} per node of {hw.devices_per_node} devices): use more "
                f"devices or a host with more memory (Hardware.host_memory_bytes)")
    return ("what stays on the device (activations, gradients until they are final, a chunk at a time) is over the "
            "budget even with recomputation")
