"""A pipelined plan's step cut into one forward and one backward program per stage.

Every stage runs the statements of its own units (autopar.ir.pipeline.Pipeline.node_units), in
the order the whole step runs them (autopar.lowering.schedule). A move runs on the stage of
its first reader in the direction its phase flows (forward: the earliest stage, backward: the
latest), so a parameter's gather and a gradient's sync stay with the parameter. A parameter
belongs to the one stage that reads it (a tied weight is one parameter per name here: the
runtime sums its copies' gradients); buffers and constants are copied onto every stage that
reads them; the model's inputs enter at stage 0.

Between stage k and k+1 travel, in forward, the forward values defined at or before k that a
later stage reads (values a stage does not read pass through it), and in backward the
backward values defined after k that a stage at or before k reads. torch.distributed.pipelining
sends backward only the gradients of the forward values it sent, shaped as them, so each
backward value rides in the gradient slot of a sent forward value of its own local shape and
dtype (usually it is that value's gradient); where none is free, stage k sends a zero
``carrier`` of that shape in forward, for its gradient slot to bring the value back.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from autopar.errors import AutoparError
from autopar.lowering.schedule import RETURNS, Statement, backward_start, schedule, with_frees


@dataclass(frozen=True)
class Slot:
    """One tensor stage k sends stage k+1 in forward: this rank's block of it."""
    var: str
    shape: tuple[int, ...]
    dtype: str
    carries: str | None = None  # the backward value that comes back in its gradient's place
    carrier: bool = False  # a zero tensor sent only for its gradient slot

    @property
    def differentiable(self) -> bool:
        return self.carries is not None


@dataclass(frozen=True)
class StageProgram:
    index: int
    placeholders: tuple[str, ...]  # its parameters' and buffers' placeholders (and stage 0's inputs), in order
    inputs: tuple[str, ...]  # the model inputs it reads as placeholders (stage 0 only)
    receives: tuple[Slot, ...]  # from the stage before (none on stage 0)
    sends: tuple[Slot, ...]  # to the stage after (none on the last)
    forward: list[Statement]  # its forward statements, ending with a return of sends, saved (and the loss)
    # backward in two: the input gradient's work (what the stage before waits for), ending with a
    # return of what goes back and of ``kept``; then the rest, the weight gradients' (W)
    backward_input: list[Statement]
    backward_weight: list[Statement]  # ending with a return of the gradients
    saved: tuple[str, ...]  # forward values its backward reads, in the order forward defines them
    kept: tuple[str, ...]  # what the weight-gradient program reads of the input-gradient one's and its inputs
    gradients: tuple[str, ...]  # the gradient nodes of its parameters, in GraphIR.gradients' order
    loss: str | None  # the loss, on the last stage
    # of ``saved``: the counts of labelled targets a mean loss divides by (nll_loss's total
    # weight), which must be alike in every micro-batch for their mean to be the batch's
    normalizers: tuple[str, ...] = ()
    values: tuple[str, ...] = ()  # the model's other outputs (logits) it computes: on the last stage

    @property
    def grads_in(self) -> tuple[str, ...]:
        """The backward values the next stage sends back, in its slots' order."""
        return _carried(self.sends)

    @property
    def grads_out(self) -> tuple[str, ...]:
        """The backward values it sends to the stage before, in its received slots' order."""
        return _carried(self.receives)


def _carried(slots) -> tuple[str, ...]:
    return tuple(s.carries for s in slots if s.carries is not None)


def stage_programs(plan) -> list[StageProgram]:
    """The per-stage programs of ``plan`` (a plan with a pipeline), as both the torch code
    generator and the runtime read them."""
    _refuse_unsupported(plan)
    statements = schedule(plan.graph, plan.strategies, plan.redistributions, plan.mesh, plan.recompute,
                          prefetch=plan.prefetch)
    return _Splitter(plan, statements).run()


def _refuse_unsupported(plan) -> None:
    graph = plan.graph
    if graph.mutated:
        raise AutoparError(f"the model updates buffers in forward ({', '.join(sorted(graph.mutated.values()))}: "
                           f"BatchNorm statistics?), which a pipeline would update once per micro-batch where eager "
                           f"updates them once per batch; plan it without a 'pp' mesh axis")
    if graph.loss is None:
        raise AutoparError("a pipeline runs training steps, and this call's output holds no loss")


class _Splitter:
    def __init__(self, plan, statements: list[Statement]):
        self.plan, self.graph, self.statements = plan, plan.graph, statements
        self.n = len(plan.pipeline.stages)
        self.node_stage = plan.pipeline.node_stages()
        self.boundary = backward_start(statements)
        self.readers: dict[str, list[int]] = {}
        for i, s in enumerate(statements):
            for u in s.uses:
                self.readers.setdefault(u, []).append(i)
        self.stages: dict[int, set[int]] = {}  # statement index -> the stages that run it
        # gradient node -> the variable backward returns for it (moved into its parameter's layout)
        self.returned = dict(zip(self.graph.gradients, statements[-1].uses))
        self.normalizers = _loss_normalizers(self.graph)

    def run(self) -> list[StageProgram]:
        self.assign()
        crossing_fwd, crossing_bwd = self.crossings(*self.definers())
        metas = self.metas()
        boundaries = [self.slots(k, crossing_fwd[k], crossing_bwd[k], metas) for k in range(self.n - 1)]
        return [self.program(s, boundaries) for s in range(self.n)]

    # --- which stage runs each statement
    def assign(self) -> None:
        kinds = ("call", "getitem")
        for i, s in enumerate(self.statements):
            if s.kind in kinds and s.node.name in self.node_stage:
                self.stages[i] = {self.node_stage[s.node.name]}
        for i, s in enumerate(self.statements):  # moves and gathers waited for, by their readers
            if s.kind in ("move", "wait"):
                self.stages[i] = {self.mover_stage(i, s.defines)}
        for i, s in enumerate(self.statements):  # a started collective, where it is waited for
            if s.kind == "start":
                self.stages[i] = set().union(*(self.stages[j] for j in self.readers.get(s.defines, [])))
        for i, s in enumerate(self.statements):
            if s.kind in ("placeholder", "constant") or i not in self.stages and s.kind not in RETURNS:
                self.stages[i] = self.reader_stages(s.defines)
        for i, s in enumerate(self.statements):
            if s.kind == "placeholder" and s.defines in self.graph.inputs:
                self.stages[i] = {0}
            elif s.kind == "placeholder" and s.defines in self.graph.params and len(self.stages[i]) > 1:
                raise AutoparError(
                    f"parameter {self.graph.params[s.defines]} is read by stages {sorted(self.stages[i])} (a "
                    f"module called by several layers?); a pipeline holds each parameter on the one stage that "
                    f"reads it (a weight tied under several names gets a copy per name): give each layer its own "
                    f"module, or plan without 'pp'")

    def reader_stages(self, var: str) -> set[int]:
        found: set[int] = set()
        for j in self.readers.get(var, []):
            found |= self.use_stages(j, var)
        return found or {0}

    def use_stages(self, j: int, var: str) -> set[int]:
        """The stages statement ``j`` reads ``var`` on."""
        s = self.statements[j]
        if s.kind == "forward_output":
            return {self.n - 1}
        if s.kind == "output":
            return {self.node_stage[g] for g, u in zip(self.graph.gradients, s.uses) if u == var}
        return self.stages.get(j, set())

    def mover_stage(self, i: int, var: str) -> int:
        readers = [j for j in self.readers.get(var, []) if self.statements[j].defines != var]
        found = set().union(*(self.use_stages(j, var) for j in readers)) or {0}  # {0}: a move nothing reads
        return min(found) if i < self.boundary else max(found)

    # --- what crosses
    def definers(self) -> tuple[dict, dict]:
        """(variable, defined in backward) -> the stages that define it, and -> the index of the
        first statement that does."""
        stages: dict[tuple[str, bool], set[int]] = {}
        first: dict[tuple[str, bool], int] = {}
        for i, s in enumerate(self.statements):
            if s.defines is not None:
                key = (s.defines, i >= self.boundary)
                stages.setdefault(key, set()).update(self.stages[i])
                first.setdefault(key, i)
        return stages, first

    def crossings(self, defined: dict, first_def: dict) -> tuple[list[dict], list[dict]]:
        """Per boundary k: the forward values that cross it and the backward values that cross
        it back, each with the index of the statement that defines it (their order)."""
        fwd: list[dict] = [{} for _ in range(self.n - 1)]
        bwd: list[dict] = [{} for _ in range(self.n - 1)]
        for j, s in enumerate(self.statements):
            in_backward = j >= self.boundary
            for u in s.uses:
                for stage in self.use_stages(j, u):
                    key = (u, True) if in_backward and (u, True) in defined else (u, False)
                    where = defined.get(key)
                    if where is None or stage in where:
                        continue
                    source = min(where) if not key[1] else max(where)
                    if key[1]:  # a backward value, from a later stage back to an earlier one
                        if source < stage:
                            self.wrong_way(u, source, stage, "backward")
                        for k in range(stage, source):
                            bwd[k][u] = first_def[key]
                    else:
                        if source > stage:
                            self.wrong_way(u, source, stage, "forward")
                        for k in range(source, stage):
                            fwd[k][u] = first_def[key]
        return fwd, bwd

    def wrong_way(self, var: str, source: int, stage: int, phase: str) -> None:
        raise AutoparError(
            f"stage {stage} reads {var}, which stage {source} computes in {phase}: a pipeline sends forward values to "
            f"later stages and backward values to earlier ones only; this model's units do not run in layer order "
            f"(a value shared across layers?); plan it without a 'pp' mesh axis")

    def metas(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """variable -> (this rank's block shape, dtype), for the variables that may cross."""
        graph, plan = self.graph, self.plan
        out = {}
        for s in self.statements:
            if s.defines is None or s.defines in out:
                continue
            if s.kind in ("move", "wait"):
                meta, spec = graph.node(s.redistribution.value).outputs[0], s.redistribution.dst
            elif s.kind == "getitem":
                src, index = s.node.args
                meta, spec = graph.node(src["ref"]).outputs[index], plan.strategies[src["ref"]].out_specs[index]
            elif s.node is not None and len(s.node.outputs) == 1:
                meta, spec = s.node.outputs[0], plan.strategies[s.node.name].out_specs[0]
            else:
                continue
            if meta is not None:
                out[s.defines] = (tuple(spec.local_shape(meta.shape, plan.mesh)), meta.dtype)
        return out

    def slots(self, k: int, forward: dict, backward: dict, metas: dict) -> tuple[Slot, ...]:
        """Boundary k's forward slots, each backward value given one to ride back in."""
        for var in list(forward) + list(backward):
            if var not in metas:
                raise AutoparError(f"{var} crosses from stage {k} to {k + 1} and is not one tensor (a tuple?); "
                                   f"a pipeline sends tensors only: plan it without 'pp'")
        slots = [Slot(v, *metas[v]) for v in sorted(forward, key=forward.get)]
        carriers = []
        for b in sorted(backward, key=backward.get):
            free = next((i for i, s in enumerate(slots) if s.carries is None and (s.shape, s.dtype) == metas[b]
                         and _floating(s.dtype)), None)
            if free is not None:
                slots[free] = replace(slots[free], carries=b)
            else:
                carriers.append(Slot(f"carrier{k}_{len(carriers)}", *metas[b], carries=b, carrier=True))
        return tuple(slots + carriers)

    # --- one stage's programs
    def program(self, stage: int, boundaries: list) -> StageProgram:
        receives = boundaries[stage - 1] if stage > 0 else ()
        sends = boundaries[stage] if stage < self.n - 1 else ()
        forward = [s for i, s in enumerate(self.statements[:self.boundary])
                   if stage in self.stages.get(i, ()) and s.kind not in RETURNS]
        backward = [s for i, s in enumerate(self.statements[self.boundary:], self.boundary)
                    if stage in self.stages.get(i, ()) and s.kind not in RETURNS]
        local_fwd = {s.defines for s in forward if s.defines is not None} | {r.var for r in receives}
        placeholders = tuple(s.defines for s in forward if s.kind == "placeholder")
        args = set(placeholders) - set(self.graph.inputs)  # the runtime hands these to backward again
        read_back = {u for s in backward for u in s.uses}
        back_defined = {s.defines for s in backward}
        saved = tuple(v for v in dict.fromkeys([r.var for r in receives] + [s.defines for s in forward])
                      if v in read_back and v in local_fwd and v not in args and v not in back_defined)
        gradients = tuple(g for g in self.graph.gradients if self.node_stage.get(g) == stage)
        loss = self.graph.loss if stage == self.n - 1 else None
        values = tuple(v for v in self.graph.values if v in local_fwd) if stage == self.n - 1 else ()
        forward_return = Statement("forward_output", None, tuple(s.var for s in sends if not s.carrier)
                                   + saved + ((loss,) if loss else ()) + values)
        grads_out = _carried(receives)
        weight_return = Statement("output", None, tuple(self.returned[g] for g in gradients))
        first, rest = _split_input_gradient(backward, grads_out)
        made_by_rest = {s.defines for s in rest}
        kept = tuple(dict.fromkeys(u for s in rest + [weight_return] for u in s.uses
                                   if u not in made_by_rest and u not in args))
        normalizers = tuple(v for v in self.normalizers if v in saved)
        return StageProgram(stage, placeholders, tuple(v for v in placeholders if v in self.graph.inputs),
                            receives, sends, with_frees(forward + [forward_return]),
                            with_frees(first + [Statement("output", None, grads_out + kept)], held=args),
                            with_frees(rest + [weight_return], held=args), saved, kept, gradients, loss, normalizers,
                            values)


_MEAN = 1  # torch's Reduction::Mean


def _loss_normalizers(graph) -> list[str]:
    """The total weights of nll_losses (cross entropy) a mean divides by: how many targets are
    labelled (not ignore_index). Capture writes a mean as the sum over the total weight
    (autopar.capture.canonicalize), so a total weight is one where a division reads it."""
    losses = {n.name: n.args[3] for n in graph.nodes if n.target == "aten.nll_loss_forward.default"}
    weights = {n.name: losses[n.args[0]["ref"]] for n in graph.nodes
               if n.target == "getitem" and n.args[0]["ref"] in losses and n.args[1] == 1}
    divisors = {n.args[1]["ref"] for n in graph.nodes if n.target == "aten.div.Tensor" and isinstance(n.args[1], dict)}
    return [w for w, reduction in weights.items() if reduction == _MEAN or w in divisors]


def _split_input_gradient(backward: list[Statement], sent: tuple[str, ...]) -> tuple[list, list]:
    """(the statements the values sent back depend on, the rest), each in program order: a
    zero-bubble schedule runs the first as soon as the gradient arrives (I) and the rest,
    weight gradients and their syncs, later (W)."""
    definers: dict[str, list[int]] = {}
    for i, s in enumerate(backward):
        if s.defines is not None:
            definers.setdefault(s.defines, []).append(i)
    needed: set[int] = set()
    stack = [i for v in sent for i in definers.get(v, [])]
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        stack += [j for u in backward[i].uses for j in definers.get(u, []) if j < i]
    return ([s for i, s in enumerate(backward) if i in needed],
            [s for i, s in enumerate(backward) if i not in needed])


def _floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))
