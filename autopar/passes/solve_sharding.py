"""solve_sharding: one strategy per node, by the OR-Tools model in ``autopar.solver``.

Nodes tied together (followers) share one variable; edges inside a group fold
into the group's own cost. Two constraints make the program a training step:
the loss ends replicated, and each gradient ends in its parameter's layout.
The first collective of each gradient's move runs under the backward pass
(``Hardware.gradient_overlap``), so only what backward cannot cover counts.
"""
from __future__ import annotations

import math

from autopar.errors import AutoparError
from autopar.passes.base import Pass, PassContext
from autopar.placement import Spec
from autopar.program import Program, forward_nodes, tensor_inputs
from autopar.solver import Overlap, solve


class SolveShardingPass(Pass):
    name = "solve_sharding"
    requires = ("meta", "strategies", "tied_to")
    provides = ("choice", "solver")

    def run(self, program: Program, ctx: PassContext) -> str:
        meta, strategies, tied = program.table("meta"), program.table("strategies"), program.table("tied_to")
        cost = ctx.cost

        def root(name: str) -> str:
            while name in tied:
                name = tied[name]
            return name

        groups = [n for n in strategies if n not in tied]
        index = {g: i for i, g in enumerate(groups)}
        node_costs = [[0.0] * len(strategies[g]) for g in groups]
        cover = [[0.0] * len(strategies[g]) for g in groups]  # backward compute that gradient syncs hide under
        edge_acc: dict[tuple[int, int], list[list[float]]] = {}
        overlap_acc: dict[tuple[int, int], list[list[float]]] = {}

        def add_edge(src: str, dst: str, matrix_fn, acc_by_pair=edge_acc) -> None:
            gi, gj = index[root(src)], index[root(dst)]
            n_src, n_dst = len(strategies[src]), len(strategies[dst])
            if gi == gj:
                for k in range(n_src):
                    node_costs[gi][k] += matrix_fn(k, k)
                return
            if (gj, gi) in acc_by_pair:
                acc = acc_by_pair[gj, gi]
                for a in range(n_dst):
                    for b in range(n_src):
                        acc[a][b] += matrix_fn(b, a)
                return
            acc = acc_by_pair.setdefault((gi, gj), [[0.0] * n_dst for _ in range(n_src)])
            for a in range(n_src):
                for b in range(n_dst):
                    acc[a][b] += matrix_fn(a, b)

        forward = forward_nodes(program)
        kappa = cost.hardware.gradient_overlap
        for node in program.nodes():
            if node.op != "call_function":
                continue
            g = index[root(node.name)]
            for k, s in enumerate(strategies[node.name]):
                node_costs[g][k] += s.compute_s
                if node.name not in forward:
                    cover[g][k] += kappa * s.compute_s
            for j, arg in enumerate(tensor_inputs(node)):
                if node.name in tied and tied[node.name] == arg.name and arg.op == "call_function" \
                        and len(meta[arg.name]) > 1:
                    continue  # getitem of a multi-output op: same layout by construction
                src_meta = meta[arg.name][0]
                add_edge(arg.name, node.name, lambda a, b, arg=arg, node=node, j=j, m=src_meta: cost.reshard_time(
                    m, strategies[arg.name][a].out_specs[0], strategies[node.name][b].in_specs[j]))

        # the loss must end replicated on every rank
        loss_group = index[root(program.loss)]
        for k, s in enumerate(strategies[program.loss]):
            if not s.out_specs[0].is_replicated():
                node_costs[loss_group][k] = math.inf
        # each gradient must end in its parameter's layout, so the optimizer updates matching shards
        for grad, param in program.gradient_targets():
            def layouts(a, b, g=grad, p=param):
                return meta[g][0], strategies[g][a].out_specs[0], strategies[p][b].out_specs[0]

            hideable = kappa > 0 and index[root(grad)] != index[param]
            add_edge(grad, param, lambda a, b: cost.reshard_time(*layouts(a, b))
                     - (cost.async_time(*layouts(a, b)) if hideable else 0.0))
            if hideable:
                add_edge(grad, param, lambda a, b: cost.async_time(*layouts(a, b)), overlap_acc)

        for name, allowed in _pinned(program, strategies, ctx.options.get("pin", {}), ctx.mesh).items():
            for k, s in enumerate(strategies[name]):
                if s.out_specs[0] != allowed:
                    node_costs[index[name]][k] = math.inf

        edges = [(i, j, m) for (i, j), m in edge_acc.items()]
        hint = [_replicated_index(strategies[g]) for g in groups]
        result = solve(node_costs, edges, backend=ctx.options.get("solver", "mip"),
                       time_limit_s=ctx.options.get("solver_time_limit_s", 60.0),
                       hint=hint if None not in hint else None, progress=ctx.progress,
                       overlap=Overlap([(i, j, m) for (i, j), m in overlap_acc.items()], cover) if overlap_acc else None)
        choice = {}
        for name in strategies:
            choice[name] = strategies[name][result.choice[index[root(name)]]]
        program.tables["choice"] = choice
        program.tables["solver"] = result
        return (f"{len(groups)} variables groups, {len(edges)} edges, {result.n_variables} booleans, "
                f"{result.status}, objective {result.objective * 1e3:.4f} ms, gap {result.gap:.2%}")


def _pinned(program: Program, strategies: dict, pin: dict, mesh) -> dict:
    """Placeholder name -> the Spec the user pinned its parameter to (checked against its options)."""
    placeholder = {fqn: ph for ph, fqn in program.params.items()}
    out = {}
    for fqn, text in pin.items():
        if fqn not in placeholder:
            raise AutoparError(f"cannot pin {fqn!r}: the model has no such parameter (it has e.g. "
                               f"{', '.join(sorted(placeholder)[:4])})")
        try:
            spec = Spec.from_json(text) if isinstance(text, str) else Spec(tuple(text))
        except ValueError as exc:
            raise AutoparError(f"cannot pin {fqn!r}: {exc}") from exc
        options = [s.out_specs[0] for s in strategies[placeholder[fqn]]]
        if len(spec.placements) != mesh.ndim or spec not in options:
            raise AutoparError(f"cannot pin {fqn!r} to {text!r} on mesh {mesh}: its layouts are "
                               f"{', '.join(o.to_json() for o in options)} (one placement per mesh axis)")
        out[placeholder[fqn]] = spec
    return out


def _replicated_index(options) -> int | None:
    for k, s in enumerate(options):
        if all(spec.is_replicated() for spec in s.in_specs + s.out_specs):
            return k
    return None


