"""One plan's emitted programs, loaded on this rank: the arguments a call gives them, and their
results turned back into what the model returns.

The model's other outputs (logits, hidden states) come back as DTensors in the layout the plan
gave them: no communication is spent on a value the caller may never read, and
``value.full_tensor()`` gathers it where it is wanted. The loss is a plain tensor, the same on
every rank.
"""
from __future__ import annotations

import hashlib
import linecache
import math
import types
import warnings

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch import nn

from autopar.errors import AutoparError, PlanMismatchError, user_stacklevel
from autopar.ir.call import FlatCall, call_signature, flatten_call, frozen_parameters, module_modes
from autopar.ir.mesh import Mesh
from autopar.ir.placement import R, Shard, Spec
from autopar.ir.plan import Plan
from autopar.ir.program import STEP
from autopar.lowering.schedule import programs
from autopar.runtime.compiling import compile_program
from autopar.runtime.offload import ChunkStore
from autopar.runtime.rank_mesh import RankMesh, local_shard
from autopar.runtime.state import as_dtensor, local
from autopar.runtime.traced_collectives import TracedCollectives


def load_program(source: str, name: str = "autopar_generated") -> types.ModuleType:
    """The emitted torch program as a module with ``forward`` (and ``backward``, for a training
    step). Its source is registered with linecache, so tracebacks and errors (a collective's
    timeout) show the program's statements."""
    module = types.ModuleType(name)
    filename = f"<{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def program_identity(plan: Plan, key: tuple) -> str:
    """A short text that differs between two ranks running other plans or other programs of a plan."""
    return f"plan {plan.hash}, program {hashlib.sha256(repr(key).encode()).hexdigest()[:12]}"


def model_state(model: nn.Module) -> tuple:
    """What of the model, besides the call, selects a program: its modules' modes and its frozen
    parameters (read once per call: it walks every module and parameter)."""
    return module_modes(model), frozen_parameters(model)


def program_key(kind: str, state: tuple, call: FlatCall) -> tuple:
    """What a program serves: a training step or a forward alone, for a model in ``state``
    (model_state) and one call signature."""
    return (kind,) + state + (call.signature,)


def plan_key(plan: Plan) -> tuple:
    """The program_key of the calls a plan was made for."""
    graph = plan.graph
    inputs = [(graph.node(ph).outputs[0].shape, graph.node(ph).outputs[0].dtype) for ph in graph.inputs]
    return graph.kind, graph.modes, tuple(graph.frozen), call_signature(graph.input_structure, inputs)


class RankProgram:
    """A plan's programs on this rank. ``compiled``: each runs through ``torch.compile``
    (Inductor) and calls functional collectives (autopar.runtime.traced_collectives), so its
    graph holds the communication; compiled once per program, at its first call."""

    def __init__(self, plan: Plan, source: str, rank_mesh: RankMesh, compiled: bool = False,
                 chunks: ChunkStore | None = None):
        """``chunks``: an offloading plan's host chunks, which its programs read parameters from."""
        self.plan, self.rt, self.chunks = plan, rank_mesh, chunks
        self.module = load_program(source, f"autopar_plan_{plan.hash}")
        self._forward, self._backward = self.module.forward, getattr(self.module, "backward", None)
        self._rt = rank_mesh
        if compiled:
            self._forward = compile_program(self._forward)
            self._backward = self._backward and compile_program(self._backward)
            self._rt = TracedCollectives(rank_mesh)
        graph = plan.graph
        self.key = plan_key(plan)
        self.agreed = False  # whether every rank was found to run this program too (RankMesh.agree)
        self.grad_fqns = tuple(dict.fromkeys(graph.grads.values()))  # the parameters backward gives gradients
        offloaded = {ph for ph, fqn in graph.params.items() if plan.offload is not None and fqn in plan.offload.params}
        # an offloaded parameter is no argument: the programs read it from ``chunks``
        self._placeholders = [n.name for n in graph.nodes if n.op == "placeholder" and n.name not in offloaded]
        self._keep_old = _buffers_backward_reads_before_update(plan)
        self._warned_dropped = False

    def forward(self, args: list):
        """(loss, saved, values, {buffer: new value}) of the forward program on ``args``."""
        return self._forward(*self._leading(), *args)

    def backward(self, args: list, saved: list, grad_loss: torch.Tensor, sync: bool, unsynced: dict) -> dict:
        """{parameter: gradient} of the backward program (autopar.backends.torch.codegen)."""
        return self._backward(*self._leading(), *args, saved, grad_loss, sync, unsynced)

    def _leading(self) -> tuple:
        return (self._rt,) if self.plan.offload is None else (self._rt, self.chunks)

    @property
    def is_step(self) -> bool:
        return self.plan.graph.kind == STEP

    def arguments(self, model: nn.Module, params: dict, call: FlatCall, given: Spec | None = None) -> list:
        """The programs' arguments: parameters (``params``: the model's named_parameters), buffers and
        this rank's block of each input, in the plan's placeholder order. ``given``: the layout the
        call's tensors are in, where they are this rank's blocks (autoparallelize's
        inputs="local"); None: they are whole."""
        graph, plan = self.plan.graph, self.plan
        tensors = dict(zip(graph.inputs, call.tensors))
        args = []
        for name in self._placeholders:
            if name in graph.params:
                args.append(local(params[graph.params[name]]).detach())  # a DTensor's detach dispatches
            elif name in graph.buffers:
                buffer = local(model.get_buffer(graph.buffers[name]))
                args.append(buffer.clone() if name in self._keep_old else buffer)
            elif given is None:
                args.append(local_shard(tensors[name].to(self.rt.device), plan.out_spec(name), plan.mesh,
                                        self.rt.coords))
            else:
                args.append(self.rt.redistribute(tensors[name].to(self.rt.device), given, plan.out_spec(name)))
        return args

    def write_buffers(self, model: nn.Module, updates: dict) -> None:
        """Forward's new buffer values (running statistics), each already in its buffer's layout."""
        with torch.no_grad():
            for fqn, value in updates.items():
                local(model.get_buffer(fqn)).copy_(value)

    def output(self, loss, values: list):
        """What the model returns, with ``loss`` and the values (as DTensors) in their places."""
        tree = self.plan.graph.output_tree
        if tree.dropped and not self._warned_dropped:
            self._warned_dropped = True
            warnings.warn(f"the model's output holds {', '.join(sorted(set(tree.dropped)))}, which autopar's programs "
                          f"do not return: it comes back as None (for a Hugging Face model, pass use_cache=False)",
                          stacklevel=user_stacklevel())
        return tree.rebuild(loss, [self._dtensor(name, value) for name, value in zip(self.plan.graph.values, values)])

    def _dtensor(self, name: str, block: torch.Tensor):
        shape = self.plan.graph.node(name).outputs[0].shape
        return as_dtensor(block, self.rt.device_mesh, self.plan.out_spec(name).to_dtensor(), shape)


def _buffers_backward_reads_before_update(plan: Plan) -> set[str]:
    """The placeholders of buffers forward updates that backward reads too: backward must see the
    value before the update, which the runtime writes into the buffer once forward returns."""
    graph = plan.graph
    updated = {ph for ph, fqn in graph.buffers.items() if fqn in set(graph.mutated.values())}
    if not updated or graph.kind != STEP:
        return set()
    return updated & {u for s in programs(plan).backward for u in s.uses}


def batch_blocks(mesh: Mesh) -> Spec:
    """The layout of per-rank inputs: each rank's block of the batch (dim 0) over the data axes."""
    return Spec(tuple(Shard(0) if axis in mesh.data_axes() else R for axis in range(mesh.ndim)))


def global_call(call: FlatCall, mesh: Mesh) -> FlatCall:
    """The call the per-rank blocks of ``call`` (inputs="local") are blocks of, on the meta device:
    what programs are planned and looked up for."""
    blocks = math.prod(mesh.shape[axis] for axis in mesh.data_axes())
    sizes = {t.shape[0] if t.dim() else None for t in call.tensors}
    if len(sizes) > 1 or None in sizes:
        leaves = pytree.tree_flatten_with_path(call.rebuild(call.tensors))[0]
        where = ", ".join(f"{pytree.keystr(path)}: {list(t.shape)}" for path, t in leaves
                          if isinstance(t, torch.Tensor))
        raise AutoparError(f"with inputs='local' every tensor of the call is this rank's block of the batch, split "
                           f"along dim 0, so all have one dim-0 size; this call's are {where}. Pass tensors without "
                           f"a batch dim (position ids of shape [1, S], say) expanded to the batch, or use "
                           f"inputs='global'")
    return flatten_call(*call.rebuild(torch.empty((t.shape[0] * blocks,) + tuple(t.shape[1:]), dtype=t.dtype,
                                                  device="meta") for t in call.tensors))


def check_local_batches(call: FlatCall, rank_mesh: RankMesh) -> None:
    """With inputs="local", every rank's call has one signature (else ranks would run different
    programs and wait on each other), and ranks of one data-parallel block pass the same data
    (else they would compute different steps): a small all-gather of each rank's signature hash
    and checksum of its tensors."""
    mesh = rank_mesh.whole  # every rank's (a pipeline's stages' ranks too)
    signature = int(hashlib.sha256(repr(call.signature).encode()).hexdigest()[:12], 16)  # the same in every process
    digest = [float(signature),
              sum(float(t.detach().sum(dtype=torch.float64)) for t in call.tensors if t.numel())]
    gathered = [torch.zeros(2, dtype=torch.float64) for _ in range(mesh.size)]
    dist.all_gather(gathered, torch.tensor(digest, dtype=torch.float64))
    if len({g[0].item() for g in gathered}) > 1:
        raise AutoparError("with inputs='local' every rank's batch has the same shapes and structure, and these "
                           "differ between ranks (padded to different lengths?): pad every rank's batch alike")
    by_block: dict[int, set] = {}
    for rank, g in enumerate(gathered):
        by_block.setdefault(mesh.data_parallel(rank)[0], set()).add(g[1].item())
    if any(len(sums) > 1 for sums in by_block.values()):
        raise AutoparError("with inputs='local' the ranks of one data-parallel block (same coordinates on the 'dp' "
                           "axes, any on the others) pass the same samples, and these differ: give the "
                           "DistributedSampler the rank and size autopar.data_parallel_info(model) returns")


def check_call_fits(plan: Plan, call: FlatCall) -> None:
    """Refuse a call of another structure, or with inputs of other shapes or dtypes, than the
    plan's: a plan fixes them (a loss's mean divides by the planned count, views reshape to the
    planned sizes), so running it on others would compute something else."""
    graph = plan.graph
    if call.structure != graph.input_structure or len(call.tensors) != len(graph.inputs):
        raise PlanMismatchError(
            f"the model is called with other arguments than plan {plan.hash} was made for (planned: "
            f"{graph.input_structure}; given: {call.structure}): plan again with this call (autopar.plan, or "
            f"autoparallelize with replan=True)")
    names = graph.input_names or tuple(f"input {i}" for i in range(len(graph.inputs)))
    for name, ph, value in zip(names, graph.inputs, call.tensors):
        planned = graph.node(ph).outputs[0]
        given = (list(value.shape), str(value.dtype).removeprefix("torch."))
        if given != (list(planned.shape), planned.dtype):
            raise PlanMismatchError(
                f"input {name!r} has shape {given[0]} and dtype {given[1]}, but plan {plan.hash} was made for shape "
                f"{list(planned.shape)} and dtype {planned.dtype}: a plan fixes its inputs' shapes; plan again with "
                f"inputs of this shape (autopar.plan, or autoparallelize with replan=True)")
