"""pipeline_units: a solved plan cut into the chain a pipeline partitions: the part before the
repeated layers, each layer, and the part after them, each priced for one micro-batch.

Runs after predict when the mesh has a ``pp`` axis, on the plan of the whole model at the
micro-batch size on the mesh's other axes. A forward node belongs to the layer its module is
in (``<prefix>.<i>``, the longest run of repeated layers), before the first layer to the part
before, after the last to the part after; a backward node to the unit whose values it reads
(_node_units).
A backward node is input-gradient work (I) when the gradient flowing to an earlier unit
depends on it, else weight-gradient work (W), which zero-bubble schedules defer.
"""
from __future__ import annotations

import math
import operator
import re

from autopar.capture.layer_blocks import layer_runs
from autopar.capture.module_paths import module_paths
from autopar.errors import AutoparError
from autopar.ir.pipeline import UnitCost
from autopar.ir.program import Program, forward_nodes, forward_outputs
from autopar.lowering.memory import optimizer_bytes_per_element
from autopar.ops.table import rule_for
from autopar.passes.base import Pass, PassContext, side_table

side_table('pipeline_units', list, 'the chain a pipeline partitions: per unit, one micro-batch\'s UnitCost')
side_table('pipeline_node_units', dict, 'call node -> the index of its unit in pipeline_units')

BEFORE, AFTER = "<before layers>", "<after layers>"


class PipelineUnitsPass(Pass):
    name = "pipeline_units"
    requires = ("meta", "choice", "redistributions", "recompute")
    provides = ("pipeline_units", "pipeline_node_units")

    def run(self, program: Program, ctx: PassContext) -> str:
        prefix, count = _layers(program)
        unit_of = _node_units(program, prefix, count)
        names = [BEFORE] + [f"{prefix}.{i}" for i in range(count)] + [AFTER]
        program.tables["pipeline_units"] = _price(program, ctx, unit_of, names)
        program.tables["pipeline_node_units"] = unit_of
        return f"{count} layers of {prefix} between what comes before and after them"


class StageValuesPass(Pass):
    """Before the sharding solve of a pipeline's micro-batch: the forward values another unit
    reads (a rotary table the part before the layers makes, a layer's output) are never
    recomputed. A recomputed copy runs in backward in the unit of its value, and a stage's
    backward sends gradients back, never values on to later stages: the stage that reads such
    a value keeps what it received in forward instead."""
    name = "stage_values"
    before = "solve_sharding"

    def run(self, program: Program, ctx: PassContext) -> str:
        prefix, count = _layers(program)
        unit_of = _node_units(program, prefix, count)
        forward = _forward_part(program)
        crossing = {n.name for n in program.nodes() if n.name in forward and n.name in unit_of
                    and any(unit_of.get(u.name, unit_of[n.name]) != unit_of[n.name] for u in n.users)}
        ctx.constraints.keep(crossing)
        return f"{len(crossing)} forward values read in another unit, never recomputed"


def _layers(program: Program) -> tuple[str, int]:
    """The longest run of repeated layers: (prefix, how many), numbered from 0."""
    runs = layer_runs(program, min_layers=2)
    if not runs:
        raise AutoparError("a pipeline cuts the model between repeated layers (parameters named "
                           "<prefix>.<i>.<name>, as nn.ModuleList blocks are), and this model has none: plan "
                           "it without a 'pp' mesh axis")
    run = max(runs, key=lambda r: len(r.layers))
    if run.layers != list(range(len(run.layers))):
        raise AutoparError(f"the layers of {run.prefix} are numbered {run.layers[0]}..{run.layers[-1]}; a pipeline "
                           f"needs them numbered from 0 in the order forward runs them")
    return run.prefix, len(run.layers)


def _node_units(program: Program, prefix: str, count: int) -> dict[str, int]:
    """Call node -> unit: 0 before the layers, 1 + i for layer i, count + 1 after them.

    Forward nodes go by their module (glue between layers with the layer before it), and
    never before the units of their inputs. Backward nodes go by data, not module (autograd
    gives a gradient sum the module of one of its terms, often another layer's): each runs in
    the earliest unit that holds the forward values and parameters it reads and that its
    readers allow (values flow back, so a node runs no earlier than any reader; a parameter's
    gradient runs with the parameter); a sum of gradient terms alone runs where its terms are,
    so a stage sends the sum back rather than its terms."""
    forward = _forward_part(program)
    calls = [n for n in program.nodes() if n.op == "call_function"]
    out = _forward_units(program, [n for n in calls if n.name in forward], prefix, count)
    param_unit = {ph: min((out[u.name] for u in program.node(ph).users if u.name in out), default=0)
                  for ph in program.params}
    grad_unit = {grad: param_unit[ph] for grad, ph in program.gradient_targets()}
    backward = [n for n in calls if n.name not in forward]
    reads = {n.name: [out.get(i.name, param_unit.get(i.name, 0)) for i in n.all_input_nodes
                      if i.name in forward or i.name in param_unit] for n in backward}
    for n in reversed(backward):  # the earliest unit its forward inputs and its readers allow
        readers = [out[u.name] for u in n.users if u.name in out and u.name not in forward]
        out[n.name] = max(reads[n.name] + readers + ([grad_unit[n.name]] if n.name in grad_unit else []), default=0)
    for n in backward:
        inputs = [out[i.name] for i in n.all_input_nodes if i.name in out and i.name not in forward]
        if _is_item(n, out):  # where its tuple is (later than its readers: they allow it)
            out[n.name] = out[n.args[0].name]
        elif not reads[n.name] and n.name not in grad_unit and len(inputs) > 1:  # a sum of gradient terms
            out[n.name] = min(inputs)
    return out


def _is_item(node, unit_of: dict) -> bool:
    return node.target is operator.getitem and node.args[0].name in unit_of


def _forward_part(program: Program) -> set[str]:
    """The nodes the forward program runs: up to forward's last output in graph order (the
    program runs the graph in order, so values only backward reads, a norm's saved statistics,
    are computed there too: autopar.lowering.schedule)."""
    nodes = program.nodes()
    position = {n.name: i for i, n in enumerate(nodes)}
    end = max(position[name] for name in forward_outputs(program))
    return {n.name for n in nodes[:end + 1]}


def _forward_units(program: Program, nodes: list, prefix: str, count: int) -> dict[str, int]:
    layer = re.compile(rf"^{re.escape(prefix)}\.(\d+)(\.|$)")
    paths = module_paths(program)
    own = {n.name: 1 + int(m.group(1)) for n in nodes if (m := layer.match(paths.get(n.name, "")))}
    out: dict[str, int] = {}
    current = 0
    for n in nodes:
        current = own.get(n.name, current)
        out[n.name] = current
    # what runs after the last layer node is the part after the layers', not that layer's
    last = max((k for k, n in enumerate(nodes) if n.name in own), default=-1)
    for n in nodes[last + 1:]:
        out[n.name] = count + 1
    for n in nodes:  # no earlier than what it reads; an item of a tuple where the tuple is
        out[n.name] = out[n.args[0].name] if _is_item(n, out) else \
            max([out[n.name]] + [out[i.name] for i in n.all_input_nodes if i.name in out])
    return out


def _price(program: Program, ctx: PassContext, unit_of: dict[str, int], names: list[str]) -> list[UnitCost]:
    meta, choice, mesh = program.table("meta"), program.table("choice"), ctx.mesh
    forward = forward_nodes(program)
    n = len(names)
    fwd, bwd_i, bwd_w, sync = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    on_input_path = _input_gradient_work(program, unit_of, forward)
    recomputed = set(program.table("recompute").variables)
    for node in program.nodes():
        if node.op != "call_function":
            continue
        u, seconds = unit_of[node.name], choice[node.name].compute_s
        if node.name in forward:
            fwd[u] += seconds
            if node.name in recomputed:  # run again in backward, before the gradients that read it
                bwd_i[u] += seconds
        elif node.name in on_input_path:
            bwd_i[u] += seconds
        else:
            bwd_w[u] += seconds
    for r in program.table("redistributions"):
        u = unit_of.get(r.value, _reader_unit(program, r.value, unit_of))
        if r.consumers == ("output",):  # a gradient's sync: once a step, after the last micro-batch
            sync[u] += r.seconds
        elif r.phase == "forward":
            fwd[u] += r.seconds
        elif r.value in on_input_path or r.value not in unit_of:
            bwd_i[u] += r.seconds
        else:
            bwd_w[u] += r.seconds
    params, optim, elements = _parameter_bytes(program, choice, mesh, unit_of, n, ctx.request.optimizer, forward)
    saved, sent = _activation_bytes(program, meta, choice, mesh, unit_of, forward, recomputed, n)
    return [UnitCost(names[u], fwd[u], bwd_i[u], bwd_w[u], sync[u], params[u], optim[u], saved[u], sent[u],
                     elements[u]) for u in range(n)]


def _input_gradient_work(program: Program, unit_of: dict, forward: set) -> set[str]:
    """Backward nodes some node of an earlier unit depends on (directly or through others of
    their own unit): the input gradient's chain, which a stage must finish before it sends."""
    needed: set[str] = set()
    for node in reversed(program.nodes()):
        if node.op != "call_function" or node.name in forward:
            continue
        u = unit_of[node.name]
        for user in node.users:
            if user.name in unit_of and (unit_of[user.name] < u or (unit_of[user.name] == u and user.name in needed)):
                needed.add(node.name)
                break
    return needed


def _reader_unit(program: Program, value: str, unit_of: dict) -> int:
    """A placeholder's unit: that of its first reader (a parameter moved for its layer)."""
    readers = [unit_of[u.name] for u in program.node(value).users if u.name in unit_of]
    return min(readers) if readers else 0


def _local_bytes(meta, spec, mesh) -> float:
    if meta is None:
        return 0.0
    return math.prod(spec.local_shape(meta.shape, mesh)) * meta.itemsize


def _parameter_bytes(program, choice, mesh, unit_of, n, optimizer, forward) -> tuple[list, list, list]:
    """Per unit, the bytes of its parameters (and as many of their gradients) and of their
    optimizer state on one device, and their elements there. A parameter read in several units
    (tied embeddings) is held by each: every stage that reads it keeps a copy."""
    params, optim, elements = [0.0] * n, [0.0] * n, [0.0] * n
    for ph in program.params:
        meta = program.table("meta")[ph][0]
        local = _local_bytes(meta, choice[ph].out_specs[0], mesh)
        readers = {unit_of[u.name] for u in program.node(ph).users if u.name in forward} or \
            {_reader_unit(program, ph, unit_of)}
        for u in readers:
            params[u] += 2 * local  # the parameter and its gradient
            optim[u] += local / meta.itemsize * optimizer_bytes_per_element(optimizer, meta.itemsize)
            elements[u] += local / meta.itemsize
    return params, optim, elements


def _activation_bytes(program, meta, choice, mesh, unit_of, forward, recomputed, n) -> tuple[list, list]:
    """Per unit: the bytes of the forward values that backward reads (kept from F to B; a view
    keeps its base's storage, counted once), and the bytes crossing the boundary after it
    (forward values made at or before it and read after it, each sent whole)."""
    saved, sent = [0.0] * n, [0.0] * n
    kept: set[str] = set()
    for node in program.nodes():
        if node.op != "call_function" or node.name not in forward:
            continue
        u = unit_of[node.name]
        readers = [r for r in node.users if r.name in unit_of]
        if node.name not in recomputed and any(r.name not in forward for r in readers):
            base = _storage_base(node)
            if base.name in unit_of and base.name not in kept:
                kept.add(base.name)
                saved[unit_of[base.name]] += _node_bytes(base, meta, choice, mesh)
        last: int | None = max((unit_of[r.name] for r in readers if r.name in forward), default=None)
        for boundary in range(u, last if last is not None else u):
            sent[boundary] += _node_bytes(node, meta, choice, mesh)
    return saved, sent


def _node_bytes(node, meta, choice, mesh) -> float:
    return sum(_local_bytes(m, spec, mesh) for m, spec in zip(meta[node.name], choice[node.name].out_specs))


def _storage_base(node):
    """The node whose storage ``node`` lives in: itself, or what its views and tuple items read."""
    while node.op == "call_function" and (_is_view(node) or node.target is operator.getitem):
        node = node.args[0]
    return node


def _is_view(node) -> bool:
    rule = rule_for(node.target)
    return rule is not None and rule.free
