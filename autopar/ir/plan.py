"""Plan: the solved layout as pure data. JSON round trip, summary, emission."""
from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import sympy

from autopar.errors import AutoparError, PlanFormatError
from autopar.ir.cost_formula import CostFormula
from autopar.ir.graph import GraphIR
from autopar.ir.mesh import Mesh
from autopar.ir.offload import Offload
from autopar.ir.pipeline import Pipeline
from autopar.ir.placement import Spec
from autopar.ir.plan_format import FORMAT_VERSION, check_plan
from autopar.ir.records import PassRecord, Predicted, Redistribution, SolverStats
from autopar.ir.redistribute import COMMUNICATING
from autopar.ir.strategy import Strategy

# The Plan is pure data and imports no target: backends/ register their emitters and
# inspect/ its views (summary, explain) here when autopar is imported.
_EMITTERS: dict[str, Callable] = {}
_VIEWS: dict[str, Callable] = {}


def register_emitter(backend: str, emit: Callable[[Plan], str]) -> None:
    _EMITTERS[backend] = emit


def register_view(name: str, view: Callable) -> None:
    _VIEWS[name] = view


def _registered(table: dict, name: str, kind: str) -> Callable:
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; available: {', '.join(map(repr, sorted(table)))}")
    return table[name]


@dataclass(frozen=True)
class Plan:
    mesh: Mesh
    hardware: str
    graph: GraphIR
    strategies: dict  # node name -> chosen Strategy
    redistributions: tuple[Redistribution, ...]
    predicted: Predicted
    fallback_nodes: dict  # node name -> op that got the Replicate fallback
    solver: SolverStats
    history: tuple[PassRecord, ...] = field(default=())
    fallback_modules: dict = field(default_factory=dict)  # fallback node -> module path it sits in
    formula: CostFormula | None = None  # present when planned with symbolic_dims
    recompute: tuple[str, ...] = ()  # forward variables the program computes again in backward
    prefetch: bool = False  # parameter all-gathers start a layer ahead (ZeRO-3 / FSDP prefetch)
    modules: dict = field(default_factory=dict)  # call node -> module path it comes from ("" = the model)
    # on a mesh with a pp axis: the stages, schedule and micro-batches; ``mesh`` is then one
    # stage's devices and the layouts are those of every stage
    pipeline: Pipeline | None = None
    # parameters and optimizer state in host memory, in chunks moved as the program needs them
    offload: Offload | None = None
    # the mixture-of-experts routing imbalance the plan was priced at (PlanRequest.moe_imbalance)
    moe_imbalance: float = 1.0
    format_version: int = FORMAT_VERSION

    # ---- queries -------------------------------------------------------------------
    @property
    def fallback_ops(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.fallback_nodes.values())))

    @property
    def fallback_sites(self) -> dict[str, list[str]]:
        """op -> the module path of each node where it fell back ("?" where unknown)."""
        sites: dict[str, list[str]] = {}
        for node, op in sorted(self.fallback_nodes.items()):
            sites.setdefault(op, []).append(self.fallback_modules.get(node, "?") or "<model>")
        return sites

    @property
    def sharded_flops_fraction(self) -> float:
        return self.predicted.sharded_flops_fraction

    @property
    def device_mesh(self) -> Mesh:
        """The whole mesh: ``mesh``, with the pipeline's pp axis first where the plan has one."""
        if self.pipeline is None:
            return self.mesh
        return Mesh(("pp",) + self.mesh.axis_names, (self.pipeline.pp,) + self.mesh.shape)

    @property
    def fingerprint(self) -> str:
        return self.graph.fingerprint()

    @functools.cached_property
    def hash(self) -> str:
        """Identifies the decisions: graph, mesh, hardware and every layout (not timings); computed
        once per plan (a plan is frozen)."""
        body = {"graph": self.fingerprint, "mesh": self.mesh.to_json(), "hardware": self.hardware,
                "strategies": {n: _strategy_json(s) for n, s in sorted(self.strategies.items())},
                "recompute": sorted(self.recompute)}
        if self.prefetch:  # named only where taken: a plan without keeps the hash it had before prefetching
            body["prefetch"] = True
        if self.pipeline is not None:  # likewise
            body["pipeline"] = self.pipeline.decisions()
        if self.offload is not None:  # likewise
            body["offload"] = self.offload.decisions()
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]

    def cost_formula(self) -> sympy.Expr:
        """Predicted step time in seconds as a sympy expression of the named sizes."""
        return self._formula().step_time_s

    def evaluate(self, **sizes: int) -> float:
        """Re-price this plan (same layouts, no re-solve) at other sizes, e.g. ``evaluate(batch=64)``."""
        return self._formula().evaluate(**sizes)

    def _formula(self) -> CostFormula:
        if self.formula is None:
            raise AutoparError("this plan has no cost formula: plan with symbolic_dims, e.g. "
                               "autopar.plan(..., symbolic_dims={'batch': 0, 'seq': 1})")
        return self.formula

    def out_spec(self, node: str) -> Spec:
        return self.strategies[node].out_specs[0]

    def param_spec(self, fqn: str) -> Spec:
        for ph, name in self.graph.params.items():
            if name == fqn:
                return self.out_spec(ph)
        raise KeyError(f"no parameter {fqn!r}; parameters are {sorted(self.graph.params.values())}")

    def collectives(self, phase: str | None = None) -> list[tuple[Redistribution, int]]:
        """(redistribution, step index) for every communicating step, optionally of one phase."""
        return [(r, i) for r in self.redistributions for i, s in enumerate(r.steps)
                if s.kind in COMMUNICATING and (phase is None or r.phase == phase)]

    # ---- output: dispatched to what backends/ and inspect/ register ------------------
    def emit(self, backend: str = "torch") -> str:
        """The per-rank program for ``backend`` ("torch" or "jax") as source text."""
        if self.pipeline is not None and backend != "torch":
            raise AutoparError(f"plan {self.hash} has {self.pipeline.pp} pipeline stages, which only the torch "
                               f"backend emits (for torch.distributed.pipelining); emit it for 'torch'")
        if self.offload is not None and backend != "torch":
            raise AutoparError(f"plan {self.hash} offloads parameters to host memory, which only the torch backend "
                               f"emits; emit it for 'torch', or plan with offload=False for {backend!r}")
        return _registered(_EMITTERS, backend, "backend")(self)

    def explain(self, target: str, model=None, example_inputs=None, hardware=None) -> str:
        """The layouts the solver weighed for ``target`` (a node, a parameter or a module path),
        each priced with its neighbours' chosen layouts, and why the chosen one wins. A plan
        loaded from JSON needs the ``model`` and ``example_inputs`` it was made for (and the
        ``hardware``, unless a preset's name)."""
        return _registered(_VIEWS, "explain", "view")(self, target, model, example_inputs, hardware)

    def summary(self) -> str:
        return _registered(_VIEWS, "summary", "view")(self)

    def trace(self, path, hardware=None) -> str:
        """Write the predicted step to ``path`` as a Chrome trace (open it in ui.perfetto.dev or
        chrome://tracing): per rank, the ops, collectives and their overlap, pipeline actions and
        offload's host copies, each as long as the planner priced it. Returns the path."""
        return _registered(_VIEWS, "trace", "view")(self, path, hardware)

    # ---- JSON ----------------------------------------------------------------------
    def to_json(self) -> str:
        body = {
            "format_version": self.format_version,
            "mesh": self.mesh.to_json(),
            "hardware": self.hardware,
            "graph": self.graph.to_json(),
            "strategies": {n: _strategy_json(s) for n, s in self.strategies.items()},
            "redistributions": [r.to_json() for r in self.redistributions],
            "predicted": {"step_time_s": self.predicted.step_time_s, "compute_s": self.predicted.compute_s,
                          "communication_s": self.predicted.communication_s,
                          "memory_bytes": self.predicted.memory_bytes,
                          "sharded_flops_fraction": self.predicted.sharded_flops_fraction,
                          "total_flops": self.predicted.total_flops,
                          "hidden_communication_s": self.predicted.hidden_communication_s,
                          "recompute_s": self.predicted.recompute_s,
                          "bubble_s": self.predicted.bubble_s,
                          "memory_timeline": [list(t) for t in self.predicted.memory_timeline]},
            "fallback_nodes": self.fallback_nodes,
            "fallback_modules": self.fallback_modules,
            "solver": self.solver.__dict__,
            "history": [r.__dict__ for r in self.history],
            "formula": self.formula.to_json() if self.formula else None,
            "recompute": list(self.recompute),
            "prefetch": self.prefetch,
            "modules": self.modules,
            "pipeline": self.pipeline.to_json() if self.pipeline else None,
            "offload": self.offload.to_json() if self.offload else None,
            "moe_imbalance": self.moe_imbalance,
        }
        return json.dumps(body, indent=1)

    @staticmethod
    def from_json(text: str) -> Plan:
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, TypeError) as exc:
            raise PlanFormatError(f"the plan file is not valid JSON ({exc}); re-create it with `autopar plan`") from exc
        version = d.get("format_version") if isinstance(d, dict) else None
        if version != FORMAT_VERSION:
            raise PlanFormatError(f"the plan has format version {version!r} but this autopar reads version "
                                  f"{FORMAT_VERSION}; re-create it with `autopar plan`")
        check_plan(d)  # every field, before anything (a program above all) is made from the file
        try:
            return Plan(
                mesh=Mesh.from_json(d["mesh"]),
                hardware=d["hardware"],
                graph=GraphIR.from_json(d["graph"]),
                strategies={n: _strategy_from_json(s) for n, s in d["strategies"].items()},
                redistributions=tuple(Redistribution.from_json(r) for r in d["redistributions"]),
                predicted=_predicted_from_json(d["predicted"]),
                fallback_nodes=dict(d["fallback_nodes"]),
                fallback_modules=dict(d.get("fallback_modules", {})),  # absent in plans from before it existed
                solver=SolverStats(**d["solver"]),
                history=tuple(PassRecord(**r) for r in d["history"]),
                formula=CostFormula.from_json(d["formula"]) if d.get("formula") else None,
                recompute=tuple(d.get("recompute", ())),  # absent in plans from before it existed
                prefetch=bool(d.get("prefetch", False)),  # likewise
                modules=dict(d.get("modules", {})),  # likewise
                pipeline=Pipeline.from_json(d["pipeline"]) if d.get("pipeline") else None,  # likewise
                offload=Offload.from_json(d["offload"]) if d.get("offload") else None,  # likewise
                moe_imbalance=float(d.get("moe_imbalance", 1.0)),  # likewise
                format_version=version,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanFormatError(f"the plan file is corrupt ({type(exc).__name__}: {exc}); "
                                  f"re-create it with `autopar plan`") from exc


def _predicted_from_json(d: dict) -> Predicted:
    d = dict(d)
    d["memory_timeline"] = tuple(tuple(t) for t in d.get("memory_timeline", ()))
    return Predicted(**d)


def _strategy_json(s: Strategy) -> dict:
    return {"in": [x.to_json() for x in s.in_specs], "out": [x.to_json() for x in s.out_specs],
            "compute_s": s.compute_s}


def _strategy_from_json(d: dict) -> Strategy:
    return Strategy(tuple(Spec.from_json(x) for x in d["in"]), tuple(Spec.from_json(x) for x in d["out"]),
                    d["compute_s"])
