"""cost formula: the solved plan re-priced with sizes as symbols.

Runs only when the user names symbolic sizes. It prices the chosen strategies
and redistributions with the same functions the solver used, on shapes whose
dims are formulas (autopar.capture.symbolic_shapes), so substituting the planning sizes
gives back the predicted step time.
"""
from __future__ import annotations

import operator

import sympy
from torch import nn

from autopar.capture.symbolic_shapes import SizeSymbols, fit_shapes
from autopar.ir.cost_formula import CostFormula
from autopar.ir.program import Program, forward_nodes, is_multi_output, tensor_inputs
from autopar.lowering.schedule import moved_name
from autopar.ops.table import rule_for
from autopar.passes.base import Pass, PassContext, side_table
from autopar.passes.collectives import COMMUNICATING
from autopar.passes.predict import exposed
from autopar.passes.strategies import FALLBACK, compute_time, make_call

side_table('symbolic_meta', dict, 'node -> its output shapes as polynomials of the named sizes')
side_table('cost_formula', CostFormula, 'the step time as a formula of the named sizes')


class SymbolicShapesPass(Pass):
    name = "symbolic-shapes"
    requires = ("meta",)
    provides = ("symbolic_meta",)

    def __init__(self, model: nn.Module, example_inputs: tuple, sizes: SizeSymbols, loss_fn=None):
        self.model, self.example_inputs, self.sizes, self.loss_fn = model, example_inputs, sizes, loss_fn

    def run(self, program: Program, ctx: PassContext) -> str:
        program.tables["symbolic_meta"] = fit_shapes(self.model, self.example_inputs, program, self.sizes, ctx.report,
                                                     self.loss_fn)
        return f"{2 ** len(self.sizes.dims) - 1} extra captures at other {', '.join(self.sizes.dims)}"


class CostFormulaPass(Pass):
    name = "cost-formula"
    requires = ("meta", "symbolic_meta", "choice", "fallback", "redistributions", "recompute")
    provides = ("cost_formula",)

    def __init__(self, sizes: SizeSymbols):
        self.sizes = sizes

    def run(self, program: Program, ctx: PassContext) -> str:
        meta, sym, choice = program.table("meta"), program.table("symbolic_meta"), program.table("choice")
        fallback = program.table("fallback")
        recomputed = set(program.table("recompute").variables)  # run twice: in forward and again in backward
        compute, backward = [], []
        forward = forward_nodes(program)
        for node in program.nodes():
            if node.op != "call_function" or (node.target is operator.getitem and is_multi_output(node.args[0])):
                continue  # getitem of a tuple reads it in place
            strategy = choice[node.name]
            rule = FALLBACK if node.name in fallback else rule_for(node.target)
            in_metas = [sym[a.name][0] for a in tensor_inputs(node)]
            # the call (its args and the rule's structural choices) stays concrete; only sizes are symbols
            seconds = compute_time(rule, make_call(node, meta), strategy.in_specs, strategy.out_specs,
                                   in_metas, list(sym[node.name]), ctx.mesh, ctx.cost)
            (compute if node.name in forward else backward).append(seconds)
            if node.name in recomputed:
                compute.append(seconds)
        ahead = set(program.table("recompute").ahead)  # parameter gathers started a layer ahead
        comm, async_comm, ahead_forward, moved = [], [], [], {}
        for r in program.table("redistributions"):
            steps = ctx.cost.step_times(sym[r.value][0], r.src, r.dst, bucketed=r.is_async)
            for i, (step, seconds, nbytes) in enumerate(steps):
                hidden = async_comm if r.is_async or r.phase == "backward" else ahead_forward
                (hidden if i == 0 and (r.is_async or r.id in ahead) else comm).append(seconds)
                if moved_name(r.value, r.id) in recomputed:
                    comm.append(seconds)
                if step.kind in COMMUNICATING:
                    moved[f"{r.id}.{i}"] = sympy.nsimplify(nbytes)  # whole bytes: exact rationals read best
        backward_s, overlap = sympy.Add(*backward), ctx.cost.hardware.gradient_overlap
        comm_s = sympy.Add(*comm) + exposed(sympy.Add(*async_comm), backward_s, overlap) + \
            exposed(sympy.Add(*ahead_forward), sympy.Add(*compute), overlap)
        formula = CostFormula(dict(self.sizes.values), sympy.Add(*compute) + backward_s, comm_s, moved)
        program.tables["cost_formula"] = formula
        terms = len(compute) + len(backward) + len(comm) + len(async_comm) + len(ahead_forward)
        return f"step time formula of {terms} terms in {', '.join(self.sizes.dims)}"
