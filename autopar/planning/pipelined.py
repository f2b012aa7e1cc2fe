"""Planning a mesh with a ``pp`` axis: the sharding of one stage's devices, the stage
partition, the micro-batch count and the schedule, chosen together.

For each candidate micro-batch count m the step is captured at the micro-batch size (every
tensor of the call that carries the batch split along dim 0: autopar.ir.call.batch_size) and
planned on the mesh's other axes, then cut into units (autopar.passes.pipeline_units). For
each schedule and number of stages per rank, the stages are partitioned by dynamic
programming (autopar.solvers.stage_partition) under each stage's memory with the
micro-batches that schedule keeps in flight on it, and the whole step is priced by simulating
torch's own action lists (autopar.cost_models.pipeline_sim); the least predicted step time
wins.

Within a stage the layout is the whole model's at the micro-batch size, solved with the
memory budget times pp (a stage holds about 1/pp of the model; its exact memory, in-flight
activations included, is checked here) and 1/m of the gradient syncs in its objective (they
run once per step, after the last micro-batch), so every stage shares one layout.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Callable

from autopar.capture.export import capture, program_inputs
from autopar.capture.module_paths import module_paths
from autopar.cost_models.collectives import axis_placement
from autopar.cost_models.pipeline_schedules import SCHEDULES, action_lists, stage_ranks, virtual_choices
from autopar.cost_models.pipeline_sim import StageTimes, in_flight, peak_activation_bytes, simulate
from autopar.errors import AutoparError
from autopar.ir.call import FlatCall, batch_size, first_microbatch, flatten_call
from autopar.ir.mesh import Mesh
from autopar.ir.pipeline import Block, Candidate, Pipeline, Stage, UnitCost
from autopar.ir.plan import Plan
from autopar.ir.records import PassRecord, Predicted
from autopar.ir.request import PlanRequest
from autopar.lowering.memory import optimizer_bytes_per_element
from autopar.passes.pipeline_units import PipelineUnitsPass, StageValuesPass
from autopar.passes.predict import exposed
from autopar.planning.bubbles import FactorsDoNotFit, with_fill
from autopar.planning.meshes import split_mesh
from autopar.planning.stage_offload import device_bytes, once_a_step_s, stage_offload, unit_moves_s, with_moves
from autopar.planning.state import planning_state, remember
from autopar.solvers.stage_partition import Chain, even_partition, fits, partition
from autopar.units import human_seconds

# micro-batch counts tried per pipeline rank when none is given: m = pp, 2 pp, 4 pp
MICROBATCHES_PER_RANK = (1, 2, 4)


def plan_pipeline(planner, request: PlanRequest) -> Plan:
    """The best pipelined plan of ``planner``'s model on ``request``'s one mesh (which has pp),
    with K-FAC's work in its bubbles where it is the optimizer: where its factors do not fit
    beside the pipeline, the pipeline is planned again in the budget they leave."""
    plan, micro = _pipelined(planner, request)
    if request.optimizer == "kfac":
        try:
            plan = _with_kfac(plan, request)
        except FactorsDoNotFit as exc:
            left = dataclasses.replace(request, memory_budget_bytes=request.memory_budget_bytes - exc.factor_bytes)
            if left.memory_budget_bytes <= 0:
                raise
            plan, micro = _pipelined(planner, left)
            plan = _with_kfac(plan, request)
    remember(plan, lambda: planning_state(micro))  # explain reads the micro-batch's planning state
    return plan


def _pipelined(planner, request: PlanRequest) -> tuple[Plan, Plan]:
    """(the best pipelined plan, its micro-batch's plan)."""
    start = time.perf_counter()
    mesh = request.meshes[0]
    pp, stage_mesh = split_mesh(mesh)
    batch = _batch_size(flatten_call(program_inputs(planner.example_inputs), planner.example_kwargs))
    # the micro-batch's program keeps its parameters on the device: a pipeline offloads whole
    # stages (autopar.planning.stage_offload), decided with the schedule
    inner = dataclasses.replace(request.on(stage_mesh), memory_budget_bytes=request.memory_budget_bytes * pp,
                                schedule=None, microbatches=None, offload=False)
    send = _send_seconds(mesh, request.hardware)
    search = functools.partial(_search, planner, inner, batch, pp, send, request)
    if request.offload is True:
        candidates, built = search(host=True)
    else:
        try:
            candidates, built = search(host=False)
        except AutoparError:  # the micro-batch's program fits no layout with the state on the device
            if request.offload is False or request.optimizer == "kfac":
                raise
            candidates, built = [], {}
        if not built and request.offload == "auto" and request.optimizer != "kfac":
            candidates, built = search(host=True)  # offload is the last lever
    if not built:
        raise AutoparError(f"no pipeline schedule fits mesh {mesh}: " + "; ".join(
            f"{c.schedule} with {c.microbatches} micro-batches: {c.note}" for c in candidates))
    candidates.sort(key=lambda c: c.step_time_s)
    best = candidates[0]
    pipeline, micro, note = built[best.schedule, best.microbatches, best.virtual]
    pipeline = dataclasses.replace(pipeline, candidates=tuple(candidates), node_units=micro.node_units)
    offloaded = f"; the stages' state in host memory: {pipeline.offload.reason}" if pipeline.offload else ""
    record = PassRecord("pipeline", time.perf_counter() - start,
                        f"{best.schedule} with {best.microbatches} micro-batches on {pp} stages"
                        f"{f' x {best.virtual} virtual' if best.virtual > 1 else ''}: step "
                        f"{human_seconds(best.step_time_s)}, bubble {best.bubble_fraction:.1%} "
                        f"({len(candidates)} candidates){note}{offloaded}")
    result = dataclasses.replace(micro.plan, pipeline=pipeline, predicted=_predicted(micro.plan.predicted, pipeline),
                                 history=(record,) + micro.plan.history)
    return result, micro.plan


_IN_FLIGHT = "; the micro-batch fitted to the budget with {} micro-batches' saved activations in flight"


def _search(planner, inner: PlanRequest, batch: int, pp: int, send, request: PlanRequest, host: bool):
    """([every candidate weighed], (schedule, m, virtual) -> (its pipeline, micro-batch, note)).
    ``host``: the stages' state in host memory, so the micro-batch's program is fitted with the
    model's parameters, gradients and optimizer state off its budget (the stages' exact device
    memory is checked when each schedule is priced)."""
    if host:
        inner = dataclasses.replace(inner, memory_budget_bytes=inner.memory_budget_bytes
                                    + _state_bytes(planner.model, request.optimizer))
    candidates, built = [], {}
    report = planner.progress or (lambda message: None)
    for m in microbatch_counts(pp, batch, request.microbatches):
        report(f"pipeline: planning a micro-batch of {batch // m} on {split_mesh(request.meshes[0])[1]}"
               f"{' with the stages in host memory' if host else ''} ...")
        found, micro, note = _fitted_microbatch(planner, dataclasses.replace(inner, sync_share=1.0 / m), batch, m,
                                                pp, send, request, host)
        candidates.extend(c for c, _ in found)
        built.update(((c.schedule, m, c.virtual), (p, micro, note)) for c, p in found if p is not None)
    return candidates, built


def _state_bytes(model, optimizer: str) -> float:
    """The whole model's parameters, gradients and optimizer state, unsharded."""
    return sum(p.numel() * (2 * p.element_size() + optimizer_bytes_per_element(optimizer, p.element_size()))
               for p in model.parameters())


def _fitted_microbatch(planner, micro_request: PlanRequest, batch: int, m: int, pp: int, send, request: PlanRequest,
                       host: bool):
    """([(candidate, its pipeline or None)], the micro-batch plan, what the pipeline's record
    adds): planned again, with more micro-batches' saved activations in flight, where every
    schedule's stages are over the budget.

    The micro-batch is first planned under pp times the budget, as if each rank held 1/pp of
    its state and one micro-batch's activations. But a rank's stage keeps up to pp micro-batches
    in flight under 1F1B (more under others), and the layers split into stages unevenly: fitted
    with n micro-batches' saved values held through its backward, the micro-batch's budget
    search recomputes (or shards) to meet that, as it would any budget; recomputation is so
    chosen for the whole micro-batch's program, not per stage."""
    micro = _plan_microbatch(planner, micro_request, batch, m)
    priced = _priced(micro, pp, m, send, request, host)
    if request.recompute != "none" and _over_memory(priced):
        micro_request, micro, priced = _fitted_with_more_in_flight(planner, micro_request, micro, priced, batch, m,
                                                                   pp, send, request, host)
    note = _IN_FLIGHT.format(micro_request.activations_in_flight) if micro_request.activations_in_flight > 1 else ""
    if not host and request.offload == "auto" and request.optimizer != "kfac" and all(p is None for _, p, _ in priced):
        # offload is the last lever: only where no schedule fits with the stages' state on the device
        priced = _priced(micro, pp, m, send, request, host=True)
    return [(c, p) for c, p, _ in priced], micro, note


def _over_memory(priced) -> bool:
    """Every schedule is ruled out for memory alone (fewer activations could fit it)."""
    return all(over for _, _, over in priced)


def _activation_bytes(micro: _Microbatch) -> float:
    return sum(u.activation_bytes for u in micro.units)


def _fitted_with_more_in_flight(planner, micro_request: PlanRequest, micro, priced, batch: int, m: int, pp: int,
                                send, request: PlanRequest, host: bool):
    """(request, micro-batch plan, priced schedules) fitted with pp micro-batches in flight,
    doubled until a schedule fits. Past 2 pp the doubling goes on only while it shrinks the
    activations the stages hold (recomputing more), and it ends where the micro-batch's budget
    search finds no layout, or at pp * m * pp in flight: a stage holds at most the m
    micro-batches of a step, each at most the whole micro-batch's activations (pp times a
    balanced stage's share). Where none fits, the last answer stands. (Each try is a whole
    budget search, so the count is not bisected down to the fewest that fit.)"""
    answer, held, in_flight = (micro_request, micro, priced), _activation_bytes(micro), pp
    while in_flight <= pp * m * pp:
        more = dataclasses.replace(micro_request, activations_in_flight=in_flight)
        try:
            fitted = _plan_microbatch(planner, more, batch, m)
        except AutoparError as why:  # no layout fits with so many in flight
            if planner.progress:
                planner.progress(f"pipeline: with {in_flight} micro-batches in flight, {why}")
            return answer
        answer, now_held = (more, fitted, _priced(fitted, pp, m, send, request, host)), _activation_bytes(fitted)
        if not _over_memory(answer[2]) or (in_flight >= 2 * pp and now_held >= held):
            return answer  # it fits, or recomputing no more with more in flight: none will fit
        held, in_flight = now_held, in_flight * 2
    return answer


def _priced(micro: _Microbatch, pp: int, m: int, send, request: PlanRequest, host: bool) -> list[tuple]:
    """Each schedule's (candidate, its pipeline or None, whether it was ruled out for memory);
    ``host``: with the stages' state in host memory."""
    out = []
    for schedule, virtual in _schedules(request, pp):
        try:
            pipeline = _price(micro.units, pp, m, schedule, virtual, send, request, host)
        except _RuledOut as why:
            out.append((Candidate(schedule, m, virtual, math.inf, 0.0, str(why)), None, why.over_memory))
            continue
        out.append((Candidate(schedule, m, virtual, pipeline.step_time_s, pipeline.bubble_fraction, ""), pipeline,
                    False))
    return out


def _with_kfac(plan: Plan, request: PlanRequest) -> Plan:
    start = time.perf_counter()
    filled = with_fill(plan, request)
    fill = filled.pipeline.fill
    record = PassRecord("bubbles", time.perf_counter() - start,
                        f"K-FAC on {len(fill.layers)} weights, curvature every {fill.refresh} step(s): step "
                        f"{human_seconds(fill.step_filled_s)} filled, {human_seconds(fill.step_unfilled_s)} unfilled, "
                        f"{human_seconds(fill.step_first_order_s)} first-order; bubble {fill.bubble_before:.1%} -> "
                        f"{fill.bubble_after:.1%}")
    return dataclasses.replace(filled, history=(record,) + filled.history)


def microbatch_counts(pp: int, batch: int, pinned) -> list[int]:
    if pinned is not None:
        if batch % pinned:
            raise AutoparError(f"microbatches={pinned} does not divide the batch of {batch} (dim 0 of the inputs): "
                               f"pick a divisor of {batch}")
        return [pinned]
    counts = [k * pp for k in MICROBATCHES_PER_RANK if batch % (k * pp) == 0]
    if not counts:
        raise AutoparError(f"a pipeline of {pp} stages needs a batch of at least {pp} samples split evenly into "
                           f"micro-batches; the batch (dim 0 of the inputs) is {batch}: give a batch that {pp} "
                           f"divides, or microbatches= a divisor of {batch}")
    return counts


def _schedules(request: PlanRequest, pp: int):
    names = [request.schedule] if request.schedule is not None else list(SCHEDULES)
    pinned = None if request.stages is None else len(request.stages) // pp  # stages per rank
    return [(name, v) for name in names for v in virtual_choices(name) if pinned in (None, v)]


def _batch_size(call: FlatCall) -> int:
    """The batch the micro-batches split (dim 0 of the tensors that carry it)."""
    batch = batch_size(call.tensors)
    if batch is None:
        raise AutoparError("a pipeline splits the batch (dim 0 of the call's tensors) into micro-batches, and this "
                           "call passes no tensor with a dim: pass the batch as tensors")
    return batch


@dataclasses.dataclass(frozen=True)
class _Microbatch:
    plan: Plan  # the whole model at the micro-batch size on one stage's mesh
    units: list  # its UnitCost chain
    node_units: dict  # call node -> its unit's index in the chain


def _plan_microbatch(planner, request: PlanRequest, batch: int, m: int) -> _Microbatch:
    size = batch // m
    args, kwargs = first_microbatch(flatten_call(program_inputs(planner.example_inputs), planner.example_kwargs), m)
    if size not in planner.microbatch_captures:
        # tied weights stay apart: each stage that reads one holds a copy (autopar.runtime.pipeline)
        program = capture(planner.model, args, kwargs=kwargs, loss_fn=planner.loss_fn, precision=request.precision,
                          untie_tied=True)
        planner.microbatch_captures[size] = (program, module_paths(program))
    program, modules = planner.microbatch_captures[size]
    micro = dataclasses.replace(planner, program=program, example_inputs=args, example_kwargs=kwargs, modules=modules,
                                passes=tuple(planner.passes) + (StageValuesPass(),))
    plan, tables = micro.plan_with(request, (PipelineUnitsPass(),))
    return _Microbatch(plan, tables["pipeline_units"], tables["pipeline_node_units"])


def _send_seconds(mesh: Mesh, hw) -> Callable[[float], float]:
    """bytes -> the P2P time between neighbouring stages, over the link the pp axis lies on."""
    link = hw.inter_node if axis_placement(mesh, 0, hw).nodes > 1 else hw.intra_node
    return link.seconds


class _RuledOut(Exception):
    """A schedule that cannot run this pipeline, and why (``over_memory``: its stages do not fit
    the budget)."""

    def __init__(self, why: str, over_memory: bool = False):
        super().__init__(why)
        self.over_memory = over_memory


def _price(units: list[UnitCost], pp: int, m: int, schedule: str, virtual: int, send, request,
           host: bool = False) -> Pipeline:
    """The partition, simulated timeline and memory of one (schedule, m, virtual) candidate;
    ``host``: with the stages' state in host memory (autopar.planning.stage_offload)."""
    n = pp * virtual
    if n > len(units):
        raise _RuledOut(f"{n} stages but only {len(units)} units (layers and the parts around them)")
    try:
        actions = action_lists(schedule, pp, m, virtual)
    except AutoparError as exc:
        raise _RuledOut(str(exc)) from exc
    ranks = stage_ranks(schedule, pp, virtual)
    held = {s: c for acts in actions.values() for s, c in in_flight(acts).items()}
    link = request.hardware.host_link
    chain = Chain([u.forward_s + u.backward_input_s + u.backward_weight_s + (unit_moves_s(u, link) if host else 0.0)
                   for u in units],
                  [u.parameter_bytes if host else u.static_bytes for u in units], [u.activation_bytes for u in units],
                  [send(u.send_bytes) for u in units[:-1]])
    budget = request.memory_budget_bytes
    # a rank holding v stages gives each a share of its budget (the exact sum is checked below)
    in_flights, budgets = [held.get(s, 0) for s in range(n)], [budget / virtual] * n
    if request.stages is not None:
        ranges = _pinned_ranges(units, request.stages)
    else:
        ranges = _partition(chain, n, m, in_flights, budgets, request.partition)
    stages = tuple(_stage(s, ranks[s], units[i:j], send(units[j - 1].send_bytes) if j < len(units) else 0.0,
                          held.get(s, 0)) for s, (i, j) in enumerate(ranges))
    times = [StageTimes(st.forward_s, st.backward_input_s, st.backward_weight_s, st.send_s) for st in stages]
    if host:
        times = [with_moves(t, st, link) for t, st in zip(times, stages)]
    timeline = simulate(actions, times)
    on_rank = [[st for st in stages if st.rank == r] for r in range(pp)]
    peaks = tuple((device_bytes(mine) if host else sum(st.parameter_bytes + st.optimizer_bytes for st in mine))
                  + peak_activation_bytes(actions[r], {st.index: st.activation_bytes for st in stages})
                  for r, mine in enumerate(on_rank))
    where = " with the stages' state in host memory" if host else ""
    if max(peaks) > budget:
        raise _RuledOut(f"pipeline rank {peaks.index(max(peaks))} would hold {max(peaks) / 2**30:.2f} GiB{where}, "
                        f"over the budget of {budget / 2**30:.2f} GiB", over_memory=True)
    offload = None
    if host:
        reason = "offload=True" if request.offload is True else "no schedule fits with the stages' state on the device"
        offload = stage_offload(stages, [units[i:j] for i, j in ranges], pp, m, request.hardware, reason)
        held, share = max(offload.host_bytes), request.hardware.host_memory_per_device
        if held > share:
            raise _RuledOut(f"pipeline rank {offload.host_bytes.index(held)} would keep {held / 2**30:.2f} GiB in "
                            f"host memory, over the host's share of {share / 2**30:.2f} GiB per device",
                            over_memory=True)
    overlap = request.hardware.gradient_overlap
    # gradients sync once a step, from the last micro-batch's backward on (as DDP's no_sync
    # accumulation does): only that backward can hide them
    ends = [timeline.rank_end_s(r) + exposed(sum(st.sync_s for st in mine), sum(st.backward_s for st in mine), overlap)
            + (once_a_step_s(offload, r, mine, m, link) if offload is not None else 0.0)
            for r, mine in enumerate(on_rank)]
    blocks = tuple(Block(iv.rank, iv.action, iv.start_s, iv.end_s) for iv in timeline.intervals)
    return Pipeline(pp, schedule, m, virtual, stages, max(ends), timeline.bubble_fraction, peaks, blocks,
                    offload=offload)


def _partition(chain: Chain, n: int, m: int, in_flights: list, budgets: list, how: str) -> tuple:
    """The stages' ranges of ``chain`` that ``how`` ("balanced" or "even") partitions."""
    if how == "even":
        found = even_partition(chain, n, m)
        if found is None:
            raise _RuledOut(f"{n} stages but only {len(chain) - 2} layers to split evenly")
        if not fits(chain, found.ranges, in_flights, budgets):
            found = None
    else:
        found = partition(chain, n, m, in_flights, budgets)
    if found is None:
        raise _RuledOut(f"no {how} partition fits the memory budget with the activations this schedule keeps in "
                        f"flight", over_memory=True)
    return found.ranges


def _pinned_ranges(units: list[UnitCost], stages: tuple[tuple[str, ...], ...]) -> list[tuple[int, int]]:
    """The ranges of ``units`` that run ``stages``' units, or an error where the model's units
    (in the modes it was captured in) are others."""
    names = [u.name for u in units]
    if [name for stage in stages for name in stage] != names:
        raise AutoparError(f"the pipeline's stages run units {[list(s) for s in stages]}, but in its current modes "
                           f"the model's units are {names}: plan the pipeline again in these modes")
    ends = list(itertools.accumulate(len(stage) for stage in stages))
    return list(zip([0] + ends[:-1], ends))


def _stage(index: int, rank: int, units: list[UnitCost], send_s: float, held: int) -> Stage:
    def total(field: str) -> float:
        return sum(getattr(u, field) for u in units)
    return Stage(index, rank, tuple(u.name for u in units), total("forward_s"), total("backward_input_s"),
                 total("backward_weight_s"), send_s, total("sync_s"), total("parameter_bytes"),
                 total("optimizer_bytes"), total("activation_bytes"), held)


def _predicted(micro: Predicted, pipeline: Pipeline) -> Predicted:
    """The whole step's prediction: the pipeline's time (the busiest rank's compute, the
    gradient syncs left exposed at the end, and the rest: bubbles and P2P waits) and the memory
    of its fullest rank."""
    busy = [sum(b.end_s - b.start_s for b in pipeline.timeline if b.rank == r) for r in range(pipeline.pp)]
    makespan = max(b.end_s for b in pipeline.timeline)
    compute, syncs = max(busy), pipeline.step_time_s - makespan
    rank = pipeline.rank_peak_bytes.index(max(pipeline.rank_peak_bytes))
    mine = [st for st in pipeline.stages if st.rank == rank]
    if pipeline.offload is None:
        params, optimizer = sum(st.parameter_bytes for st in mine), sum(st.optimizer_bytes for st in mine)
    else:  # one stage's parameters and gradients at a time; the optimizer's state on the host
        params, optimizer = device_bytes(mine), 0.0
    memory = {c: 0.0 for c in micro.memory_bytes}
    memory.update(parameters=params / 2, gradients=params / 2, optimizer_state=optimizer,
                  activations=pipeline.rank_peak_bytes[rank] - params - optimizer)
    m = pipeline.microbatches
    return Predicted(pipeline.step_time_s, compute, syncs, memory, micro.sharded_flops_fraction,
                     micro.total_flops * m, 0.0, (), micro.recompute_s * m, bubble_s=makespan - compute)
