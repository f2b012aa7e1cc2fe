"""Capture of deep models: five layers traced, the rest copied (autopar.capture.layer_expansion).

The copy must be the graph a full trace gives, op for op and edge for edge, or
capture must trace every layer."""
import pytest
import torch
from torch import fx, nn

import autopar
from autopar.capture.export import capture
from autopar.capture.layer_expansion import repeated_layers
from autopar.capture.module_paths import module_paths
from autopar.ir.program import output_metas
from examples import gpt2, hf_zoo
from tests.tiers import sampled


def structure(program) -> tuple:
    """Everything about the graph but node names: each op with its arguments as positions
    (constants by value), each placeholder's FQN, the gradients and the loss."""
    position, ops = {}, []
    fqn = {**program.params, **program.buffers}

    def ref(arg):
        if isinstance(arg, fx.Node):
            if arg.op == "get_attr":  # copied layers share one constant node, a trace makes one each
                return ("constant", tuple(program.constants[arg.name].flatten().tolist()))
            return ("node", position[arg.name])
        if isinstance(arg, (list, tuple)):
            return tuple(ref(a) for a in arg)
        if isinstance(arg, dict):
            return tuple(sorted((k, ref(v)) for k, v in arg.items()))
        return repr(arg)

    for node in (n for n in program.nodes() if n.op != "get_attr"):
        position[node.name] = len(ops)
        if node.op == "placeholder":
            ops.append(("input", fqn.get(node.name), output_metas(node)))
        else:
            ops.append((node.op, str(node.target), ref(node.args), ref(node.kwargs),
                        output_metas(node) if node.op != "output" else None))
    paths = module_paths(program)
    return (ops, sorted((position[g], f) for g, f in program.grads.items()), position[program.loss],
            [position[u] for u in program.user_inputs], [paths.get(n.name) for n in program.nodes()
                                                         if n.op == "call_function"])


@pytest.mark.parametrize("name", sampled(sorted(hf_zoo.ZOO), inner_loop=["gpt2", "llama"]))
def test_the_copied_layers_are_the_graph_a_full_trace_gives(name):
    model, inputs = hf_zoo.make(name, layers=9)
    expanded = capture(model, inputs)
    traced = capture(model, inputs, expand_layers=False)
    assert expanded.expanded_from is not None and "5 of the 9 layers" in expanded.expanded_from
    assert traced.expanded_from is None
    assert structure(expanded) == structure(traced)


def test_a_copied_gpt2_trains_like_eager_on_four_ranks(fast_network):
    model, inputs = gpt2.make(gpt2.GPT2Config(vocab=256, seq=16, layers=8, heads=4, width=64, batch=4))
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=fast_network)
    assert len(plan.graph.params) == sum(1 for _ in model.parameters())
    report = autopar.check(model, inputs, plan=plan, steps=2)
    assert report.ok, str(report)
    assert sum(t.name.startswith("grad ") for t in report.tensors) == sum(1 for _ in model.parameters())


class _Block(nn.Module):
    def __init__(self, width: int, index: int, window: int = 0, by_index: bool = False):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.layer_idx = index  # an index may differ between interchangeable layers
        self.window = window
        self.by_index = by_index

    def forward(self, x):
        scale = 1.0 / (self.layer_idx + 1) if self.by_index else 1.0  # math that depends on the index
        return x + torch.tanh(self.fc(x)) * scale


class _Stack(nn.Module):
    def __init__(self, layers=8, width=16, windows=None, by_index=False):
        super().__init__()
        self.blocks = nn.ModuleList(_Block(width, i, (windows or [0] * layers)[i], by_index) for i in range(layers))

    def forward(self, x, y):
        for block in self.blocks:
            x = block(x)
        return ((x - y) ** 2).sum()


def _stack_inputs():
    return torch.randn(4, 16), torch.randn(4, 16)


def test_layers_that_differ_in_a_plain_attribute_are_not_copies():
    assert repeated_layers(_Stack()) is not None
    assert capture(_Stack(), _stack_inputs()).expanded_from is not None
    assert repeated_layers(_Stack(windows=[0, 4] * 4)) is None  # e.g. sliding-window attention every other layer
    assert repeated_layers(_Stack(layers=4)) is None  # too few to be worth it
    assert capture(_Stack(windows=[0, 4] * 4), _stack_inputs()).expanded_from is None


def test_layers_whose_traces_differ_are_traced_in_full():
    model, inputs = _Stack(by_index=True), _stack_inputs()
    assert repeated_layers(model) is not None  # alike by their attributes, not by their math
    program = capture(model, inputs)
    assert program.expanded_from is None
    assert structure(program) == structure(capture(model, inputs, expand_layers=False))
