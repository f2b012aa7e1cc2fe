"""Torch backend: the plan as per-rank Python source.

Every rank runs the same ``step`` on its local shards: one ATen call per line,
a trailing comment with global shape, local shape and placement, and each
collective on its own line through the runtime object ``rt``. A gradient's
first all-reduce / reduce-scatter starts asynchronously right after the
gradient is computed and is waited for at the return, so it overlaps the rest
of backward.
"""
from __future__ import annotations

from autopar.backends.printer import header, human_bytes, human_seconds, literal, shape_text
from autopar.graph_ir import IRNode, resolve_target
from autopar.passes.rule_table import rule_for


def emit_torch(plan) -> str:  # plan: autopar.Plan (which imports this module)
    g = plan.graph
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    lines = header(plan, "autopar: per-rank training step for torch.distributed (generated; do not edit)")
    lines += [
        "# step(rt, *placeholders) -> (loss, *gradients), all on this rank's local shards.",
        "import torch",
        "",
        "aten = torch.ops.aten",
        "",
        f"PLAN_HASH = {plan.hash!r}",
        f"GRAPH_FINGERPRINT = {plan.fingerprint!r}",
        f"PLACEHOLDERS = {[n.name for n in placeholders]!r}",
        "",
        "",
        f"def step(rt, {', '.join(n.name for n in placeholders)}):",
    ]
    body = _Body(plan)
    for node in g.nodes:
        if node.op == "placeholder":
            body.comment_placeholder(node)
        elif node.op == "constant":
            body.constant(node)
        elif node.op == "call":
            body.call(node)
        else:
            body.output(node)
    lines += ["    " + line for line in body.lines]
    return "\n".join(lines) + "\n"


class _Body:
    def __init__(self, plan):
        self.plan = plan
        self.lines: list[str] = []
        self.by_target = {(r.value, r.dst): r for r in plan.redistributions}  # one per (value, layout)
        self.done: dict[str, str] = {}  # redistribution id -> variable holding the moved value
        grads = plan.graph.grads
        self.async_syncs = {r.value: r for r in plan.redistributions  # gradient node -> its async sync
                            if r.is_async and r.value in grads and r.dst == plan.param_spec(grads[r.value])}
        self.started: dict[str, str] = {}  # redistribution id -> variable holding its pending first step

    def spec_comment(self, name: str, index: int = 0) -> str:
        meta = self.plan.graph.node(name).outputs[index]
        spec = self.plan.strategies[name].out_specs[index]
        if meta is None:
            return ""
        local = spec.local_shape(meta.shape, self.plan.mesh)
        return f"  # {shape_text(meta.shape)} -> local {shape_text(local)} {spec}"

    def comment_placeholder(self, node: IRNode) -> None:
        role = self.plan.graph.params.get(node.name) or self.plan.graph.buffers.get(node.name) or "input"
        self.lines.append(f"# {node.name}: {role}{self.spec_comment(node.name)}")

    def redistribute(self, value: str, dst) -> str:
        """The variable holding ``value`` in layout ``dst``, emitting the steps on first use."""
        r = self.by_target.get((value, dst))
        if r is None:
            return value
        if r.id not in self.done:
            var = f"{value}__{r.id}"
            current, first = value, 0
            if r.id in self.started:
                self.lines.append(f"{var} = {self.started[r.id]}.wait()  # {r.id}: the gradient sync started above")
                current, first = var, 1
            for step, seconds, nbytes in list(zip(r.steps, r.step_seconds, r.step_bytes))[first:]:
                self.lines.append(f"{var} = {_step_call(step, current, self.plan.mesh.axis_names)}"
                                  f"  # {self._describe(r, seconds, nbytes)}")
                current = var
            self.done[r.id] = var
        return self.done[r.id]

    def start_gradient_sync(self, grad: str) -> None:
        r = self.async_syncs[grad]
        step, var = r.steps[0], f"{grad}__{r.id}_pending"
        self.lines.append(f"{var} = {_step_call(step, grad, self.plan.mesh.axis_names, 'start_')}"
                          f"  # {self._describe(r, r.step_seconds[0], r.step_bytes[0])}, overlaps the rest of backward")
        self.started[r.id] = var

    @staticmethod
    def _describe(r, seconds, nbytes) -> str:
        return f"{r.id} {r.phase}: {r.src} -> {r.dst}, {human_bytes(nbytes)}, {human_seconds(seconds)}"

    def constant(self, node: IRNode) -> None:
        meta = node.outputs[0]
        values = literal(node.args[0], str, _special)
        self.lines.append(f"{node.name} = torch.tensor({values}, dtype={_special(node.kwargs['dtype'])}, "
                          f"device=rt.device).reshape({list(meta.shape)})  # constant")

    def call(self, node: IRNode) -> None:
        self._emit_call(node)
        if node.name in self.async_syncs:
            self.start_gradient_sync(node.name)

    def _emit_call(self, node: IRNode) -> None:
        if node.target == "getitem":
            src, index = node.args
            self.lines.append(f"{node.name} = {src['ref']}[{index}]{self.spec_comment(src['ref'], index)}")
            return
        target = resolve_target(node.target)
        rule = rule_for(target)
        args = list(node.args)
        if rule is not None and rule.shape_arg is not None and rule.shape_arg < len(args):
            meta = node.outputs[0]
            args[rule.shape_arg] = list(self.plan.strategies[node.name].out_specs[0].local_shape(meta.shape,
                                                                                             self.plan.mesh))

        in_specs = iter(self.plan.strategies[node.name].in_specs)  # refs come in tensor-input order

        def ref(name: str) -> str:
            return self.redistribute(name, next(in_specs))

        text_args = [literal(a, ref, _special) for a in args]
        text_args += [f"{k}={literal(v, ref, _special)}" for k, v in node.kwargs.items()]
        if node.target == "aten.native_dropout.default":
            # random masks must not depend on the layout: draw for the global shape, keep this rank's block
            spec = self.plan.strategies[node.name].out_specs[0]
            self.lines.append(f"{node.name} = rt.native_dropout({', '.join(text_args)}, "
                              f"global_shape={list(node.outputs[0].shape)}, spec={spec.to_json()!r})  # -> {spec}")
            return
        comment = self.spec_comment(node.name) if len(node.outputs) == 1 else \
            f"  # -> {', '.join(str(s) for s in self.plan.strategies[node.name].out_specs)}"
        fallback = "  [replicated: no sharding rule]" if node.name in self.plan.fallback_nodes else ""
        op = _LOCAL_EQUIVALENT.get(node.target, node.target)
        op = op if op.startswith("aten.") else f"torch.ops.{op}"  # a library's custom op keeps its namespace
        self.lines.append(f"{node.name} = {op}({', '.join(text_args)}){comment}{fallback}")

    def output(self, node: IRNode) -> None:
        grads = self.plan.graph.grads
        outs = ["None" if name is None else
                self.redistribute(name, self.plan.param_spec(grads[name])) if name in grads else name
                for name in self.plan.graph.outputs]
        self.lines.append(f"return ({', '.join(outs)},)")


# A local block can have other strides than the global tensor had (a collective's
# output is contiguous, say), so a view that was valid globally may not be
# locally. The graph is functional, so reshape (a view when possible, else a
# copy) computes the same values.
_LOCAL_EQUIVALENT = {"aten.view.default": "aten.reshape.default", "aten._unsafe_view.default": "aten.reshape.default"}


def _step_call(step, var: str, axis_names, prefix: str = "") -> str:
    axis = repr(axis_names[step.axis])
    if step.kind in ("all_reduce", "zero_partial"):
        return f"rt.{prefix}{step.kind}({var}, {axis})"
    if step.kind == "all_to_all":
        return f"rt.{prefix}all_to_all({var}, {axis}, src_dim={step.src_dim}, dst_dim={step.dim})"
    return f"rt.{prefix}{step.kind}({var}, {axis}, dim={step.dim})"


def _special(value: dict) -> str | None:
    if "dtype" in value:
        return f"torch.{value['dtype']}"
    if "device" in value:
        return "rt.device"
    if "layout" in value:
        return f"torch.{value['layout']}"
    if "memory_format" in value:
        return f"torch.{value['memory_format']}"
    return None


