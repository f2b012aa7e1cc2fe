"""Capture a deep model by tracing five of its identical layers and copying the rest.

Tracing costs about the same for every layer (torch.export and AOTAutograd
dispatch each op through fake tensors): 80 Llama-70B layers take minutes. But an
interior layer's joint-graph blocks are the same computation on its own
parameters (``autopar.capture.layer_blocks``), so capture traces a copy of the model
whose layer list holds only its first five layers, checks that layers 2 and 3
are the same computation relative to their neighbours, and builds the N-layer
graph by instantiating layer 2's blocks for layers 2..N-3 and layers 3 and 4's
for N-2 and N-1, in the order a full trace would have produced them. (Layer 1's
blocks are no template: the first layer's backward often differs, e.g. when the
model's input needs no gradient, and block boundaries next to it shift.)

It applies only where it is safe to assume: one ``nn.ModuleList`` whose layers
have the same classes, parameters and plain attributes (an index such as
``layer_idx`` may differ); if the shortened model's layers 2 and 3 trace to
different blocks (e.g. a per-layer constant), capture traces every layer instead.
"""
from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable

from torch import fx, nn

from autopar.capture.layer_blocks import LAYER_NAME, LayerBlocks, layer_blocks, layer_runs
from autopar.ir.program import Program

TRACED_LAYERS = 5  # first, second, two interior ones that must match, last
MIN_LAYERS = 8  # below this a full trace is cheap enough
_INDEX_ATTRIBUTES = re.compile(r"^(layer_?(idx|id|index|number|num)|idx|index)$")


class CannotExpand(Exception):
    """The layers are not copies of one computation; trace them all."""


def repeated_layers(model: nn.Module, min_layers: int = MIN_LAYERS) -> tuple[str, nn.ModuleList] | None:
    """The model's largest list of interchangeable layers: (its path, the list), or None."""
    best = None
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < min_layers:
            continue
        layers = list(module)
        if not all(_same_layer(layers[0], layer) for layer in layers[1:]):
            continue
        size = sum(p.numel() for p in module.parameters())
        if best is None or size > best[0]:
            best = (size, path, module)
    return None if best is None else (best[1], best[2])


def _same_layer(a: nn.Module, b: nn.Module) -> bool:
    mods_a, mods_b = dict(a.named_modules()), dict(b.named_modules())
    if mods_a.keys() != mods_b.keys():
        return False
    for name, ma in mods_a.items():
        mb = mods_b[name]
        if type(ma) is not type(mb) or _plain_attributes(ma) != _plain_attributes(mb):
            return False
        if [(k, p.shape, p.dtype, p.requires_grad) for k, p in ma.named_parameters(recurse=False)] != \
                [(k, p.shape, p.dtype, p.requires_grad) for k, p in mb.named_parameters(recurse=False)]:
            return False
        if [(k, b.shape, b.dtype) for k, b in ma.named_buffers(recurse=False) if b is not None] != \
                [(k, b.shape, b.dtype) for k, b in mb.named_buffers(recurse=False) if b is not None]:
            return False
    return True


def _plain_attributes(module: nn.Module) -> dict:
    """Attributes that can steer forward(): numbers, strings, flags (an index excepted)."""
    return {k: v for k, v in vars(module).items()
            if not k.startswith("_") and not _INDEX_ATTRIBUTES.match(k)
            and isinstance(v, (bool, int, float, str, type(None), tuple))}


@contextlib.contextmanager
def shortened(model: nn.Module, path: str, keep: int):
    """Within the block, the list at ``path`` holds only its first ``keep`` layers."""
    owner, _, leaf = path.rpartition(".")
    parent = model.get_submodule(owner) if owner else model
    layers = getattr(parent, leaf)
    setattr(parent, leaf, nn.ModuleList(list(layers)[:keep]))
    try:
        yield
    finally:
        setattr(parent, leaf, layers)


def expand(program: Program, prefix: str, n_layers: int) -> Program:
    """The ``n_layers``-layer program of which ``program`` (``TRACED_LAYERS`` layers) is the start."""
    run = next((r for r in layer_runs(program) if r.prefix == prefix), None)
    if run is None or run.layers != list(range(TRACED_LAYERS)):
        raise CannotExpand(f"the traced layers of {prefix} do not form one run of {TRACED_LAYERS}")
    found = layer_blocks(program, run)
    if found is None:
        raise CannotExpand("the layers do not run in order")
    if any(value in found.where for value in program.values):
        raise CannotExpand("the model returns a value made inside its layers (say, each layer's hidden state): "
                           "copied layers would not return theirs")
    for phase in ("f", "b"):
        if found.signature(phase, 2, program.constants) != found.signature(phase, 3, program.constants):
            raise CannotExpand("layers 2 and 3 are not the same computation")
    try:
        return _Expansion(program, found, n_layers).build()
    except CannotExpand:
        raise
    except Exception as exc:  # noqa: BLE001 - a graph the copy gets wrong is traced in full, never used
        raise CannotExpand(f"copying the layers failed: {type(exc).__name__}: {exc}") from exc


class _Expansion:
    """Writes the N-layer graph: layers 0 and 1 as traced, 2..N-3 from layer 2, N-2 and N-1 from
    layers 3 and 4."""

    def __init__(self, program: Program, found: LayerBlocks, n_layers: int):
        self.program, self.found, self.n = program, found, n_layers
        self.prefix = found.run.prefix
        self.graph = fx.Graph()
        self.env: dict[str, fx.Node] = {}  # traced node outside the layers' blocks -> new node
        self.made: dict[tuple[str, int, int], fx.Node] = {}  # (phase, new layer, offset) -> new node
        self.inputs: dict[tuple[int, str], fx.Node] = {}  # (new layer, rest) -> new placeholder
        self.placeholders = 0
        self.params: dict[str, str] = {}  # new placeholder -> FQN
        self.buffers: dict[str, str] = {}

    def new_layers(self, traced: int) -> list[int]:
        """The layers of the expanded model that the traced layer stands for."""
        n = self.n
        return {0: [0], 1: [1], 2: list(range(2, n - 2)), 3: [n - 2], 4: [n - 1]}[traced]

    def build(self) -> Program:
        old = self.program
        for group in self._groups([n for n in old.nodes() if n.op == "placeholder"], self._input_layer):
            self._placeholders(group)
        for node in old.nodes():  # constants first: a layer's block may hold one, and its copies share it
            if node.op == "get_attr":
                self.env[node.name] = self._copy(node, self._absolute)
        done_blocks = set()
        for node in old.nodes():
            if node.op in ("placeholder", "get_attr", "output"):
                continue
            block = self.found.where.get(node.name)
            if block is None:
                self.env[node.name] = new = self._copy(node, self._absolute)
                # outside the blocks, an op of traced layer 3 or 4 (a backward op at a block's
                # edge, say) is one of layer N-2 or N-1
                _relabel_module(new, self.prefix, lambda index: self.new_layers(index)[0])
            elif block[:2] not in done_blocks:
                done_blocks.add(block[:2])
                self._instantiate(*block[:2])
        # the graph returns the loss and the other values, then each parameter's gradient in parameter order
        output = next(n for n in old.nodes() if n.op == "output")
        results, grads = [], {}
        for group in self._groups(output.args[0], self._gradient_layer):
            traced = self._gradient_layer(group[0])
            for layer in self.new_layers(traced) if traced is not None else [None]:
                for n in group:
                    new = self._absolute(n) if layer is None else self._relative(n, traced, layer)
                    results.append(new)
                    if n.name in old.grads:
                        grads[new.name] = self._rename(old.grads[n.name], layer)
        self.graph.output(tuple(results))
        self.graph.lint()
        gm = fx.GraphModule(old.gm, self.graph)
        renamed = {old_name: self._absolute(old.node(old_name)).name
                   for old_name in [old.loss, *old.user_inputs, *old.values]}
        return Program(
            gm=gm,
            params=self.params,
            buffers=self.buffers,
            user_inputs=[renamed[n] for n in old.user_inputs],
            loss=renamed[old.loss],
            grads=grads,
            values=[renamed[v] for v in old.values],
            outputs=[r.name for r in results],
            constants=dict(old.constants),
        )

    # -- placeholders and results: traced layer 2's group becomes one group per layer 2..N-3 --

    @staticmethod
    def _groups(nodes, layer_of) -> list[list]:
        """Consecutive nodes grouped by the traced layer they belong to (None: no layer)."""
        groups: list[list] = []
        for n in nodes:
            if groups and layer_of(groups[-1][0]) == layer_of(n):
                groups[-1].append(n)
            else:
                groups.append([n])
        return groups

    def _input_layer(self, placeholder: fx.Node) -> int | None:
        return self.found.input_of.get(placeholder.name, (None,))[0]

    def _gradient_layer(self, node: fx.Node) -> int | None:
        """The traced layer of the parameter ``node`` is the gradient of (it may be computed in
        a neighbour's block)."""
        fqn = self.program.grads.get(node.name) if isinstance(node, fx.Node) else None
        m = LAYER_NAME.match(fqn or "")
        return int(m.group(2)) if m and m.group(1) == self.prefix else None

    def _placeholders(self, group: list[fx.Node]) -> None:
        traced = self._input_layer(group[0])
        if traced is None:
            for ph in group:
                self.env[ph.name] = self._placeholder(ph, None, None)
            return
        for layer in self.new_layers(traced):
            for ph in group:
                rest = self.found.input_of[ph.name][1]
                self.inputs[layer, rest] = self._placeholder(ph, layer, rest)

    def _placeholder(self, ph: fx.Node, layer: int | None, rest: str | None) -> fx.Node:
        self.placeholders += 1
        new = self.graph.placeholder(f"primals_{self.placeholders}")
        new.meta = dict(ph.meta)
        for old_table, new_table in ((self.program.params, self.params), (self.program.buffers, self.buffers)):
            if ph.name in old_table:
                new_table[new.name] = old_table[ph.name] if layer is None else f"{self.prefix}.{layer}.{rest}"
        return new

    def _rename(self, fqn: str, layer: int | None) -> str:
        return fqn if layer is None else f"{self.prefix}.{layer}.{LAYER_NAME.match(fqn).group(3)}"

    # -- ops --

    def _instantiate(self, phase: str, traced: int) -> None:
        layers = self.new_layers(traced)
        for layer in (layers if phase == "f" else reversed(layers)):  # backward visits layers in reverse
            for offset, node in enumerate(self.found.blocks[phase, traced]):
                new = self._copy(node, functools.partial(self._relative, traced=traced, layer=layer))
                self.made[phase, layer, offset] = new
                _relabel_module(new, self.prefix, lambda index, shift=layer - traced: index + shift)

    def _relative(self, arg: fx.Node, traced: int, layer: int) -> fx.Node:
        """``arg`` as seen from layer ``traced``, resolved for the new layer ``layer``."""
        if arg.name in self.found.input_of:
            their_layer, rest = self.found.input_of[arg.name]
            return self._made_or_fail(self.inputs, (layer + their_layer - traced, rest), arg)
        block = self.found.where.get(arg.name)
        if block is not None:
            phase, their_layer, offset = block
            return self._made_or_fail(self.made, (phase, layer + their_layer - traced, offset), arg)
        return self._absolute(arg)

    def _absolute(self, arg: fx.Node) -> fx.Node:
        """``arg`` from outside the layers' blocks (traced layers 3 and 4 became N-2 and N-1)."""
        if arg.name in self.env:
            return self.env[arg.name]
        traced = self._input_layer(arg) if arg.name in self.found.input_of else \
            self.found.where.get(arg.name, (None, None))[1]
        if traced in (0, 1, 3, 4):
            layer = self.new_layers(traced)[0]
            if arg.name in self.found.input_of:
                return self.inputs[layer, self.found.input_of[arg.name][1]]
            phase, _, offset = self.found.where[arg.name]
            return self._made_or_fail(self.made, (phase, layer, offset), arg)
        raise CannotExpand(f"{arg.name} is read from outside layer 2's blocks")

    @staticmethod
    def _made_or_fail(table: dict, key, arg: fx.Node) -> fx.Node:
        if key not in table:
            raise CannotExpand(f"{arg.name} is read before it is made in the expanded order")
        return table[key]

    def _copy(self, node: fx.Node, resolve) -> fx.Node:
        args = fx.node.map_arg(node.args, resolve)
        kwargs = fx.node.map_arg(node.kwargs, resolve)
        if node.op == "get_attr":
            new = self.graph.get_attr(node.target)
        else:
            new = self.graph.create_node(node.op, node.target, args, kwargs)
        new.meta = dict(node.meta)
        return new


def _relabel_module(node: fx.Node, prefix: str, new_index: Callable[[int], int]) -> None:
    """A copied op belongs to its new layer's module (``autopar.capture.module_paths`` reads this:
    a forward op's own stack, a backward op's stack of the forward op it differentiates): each
    layer index under ``prefix`` in them becomes ``new_index(index)``. A block may hold ops of
    the next layer's module that precede its first parameter."""
    index = re.compile(rf"(^|\.)({re.escape(prefix)}\.)(\d+)(?=\.|$)")

    def moved(path: str) -> str:
        return index.sub(lambda m: f"{m.group(1)}{m.group(2)}{new_index(int(m.group(3)))}", path)

    for key in ("nn_module_stack", "fwd_nn_module_stack"):
        stack = node.meta.get(key)
        if stack:
            node.meta[key] = {name: (moved(path), cls) for name, (path, cls) in stack.items()}


def check_expanded(program: Program, full_model: nn.Module) -> None:
    """The expanded program has a placeholder for every parameter of the full model."""
    expected = {name for name, _ in full_model.named_parameters()}
    have = set(program.params.values())
    if have != expected:
        missing, extra = sorted(expected - have)[:3], sorted(have - expected)[:3]
        raise CannotExpand(f"parameters differ after expansion (missing {missing}, extra {extra})")
