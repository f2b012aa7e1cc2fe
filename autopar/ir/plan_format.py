"""The plan file's format, checked before anything is built from it.

A plan file looks like data (``autopar plan --out``, the plan cache, a file a colleague
shares), and the emitted programs are made from it: node names become Python variables, op
targets become calls, dtype names become ``torch.<dtype>``, module paths and pass notes
become comments. So ``Plan.from_json`` checks a file field by field before a Plan exists
(autopar.ir.format_checks): every string for what it may contain, every number for its
range, every list for its length, every reference for the node it names, and no field is
unknown. A file that breaks a rule is refused with PlanFormatError naming the field and the
rule; no program is ever made from it.
"""
from __future__ import annotations

from autopar.ir.format_checks import (
    MAX_AXES,
    MAX_NESTING,
    MAX_RANK,
    MAX_SIZE,
    action,
    boolean,
    device,
    dotted,
    dtype,
    fail,
    identifier,
    integer,
    label,
    layout,
    list_of,
    mapping,
    memory_format,
    module_path,
    nullable,
    number,
    one_of,
    op_target,
    record,
    row,
    spec,
    text,
)
from autopar.ir.redistribute import STEP_KINDS

FORMAT_VERSION = 1
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
NODE_OPS = ("placeholder", "constant", "call", "output")
# fields files of this format version may lack (written before they existed; read with defaults)
_ADDED_LATER = ("fallback_modules", "recompute", "prefetch", "modules", "pipeline", "offload", "formula",
                "moe_imbalance")
# an argument that is a one-key object: a reference to a node's value, or a torch constant by name
_ARGUMENT_OBJECTS = {"dtype": dtype, "device": device, "layout": layout, "memory_format": memory_format}


def check_plan(d) -> None:
    """Raise PlanFormatError for the first field of plan file ``d`` (parsed JSON) that breaks the format."""
    if not isinstance(d, dict):
        fail("the file", f"must be an object, not {type(d).__name__}")
    one_of(FORMAT_VERSION)(d.get("format_version"), "format_version")
    mesh = record({"axis_names": list_of(identifier, 1, MAX_AXES), "shape": list_of(integer(1, 1 << 20), 1, MAX_AXES)})
    mesh(d.get("mesh"), "mesh")
    ndim = len(d["mesh"]["axis_names"])
    if len(d["mesh"]["shape"]) != ndim or len(set(d["mesh"]["axis_names"])) != ndim:
        fail("mesh", "must name each axis once and give each one size")
    layout_of = spec(ndim)
    fields = _fields(ndim, layout_of)
    record({k: v for k, v in fields.items() if k not in _ADDED_LATER},
           {k: v for k, v in fields.items() if k in _ADDED_LATER})(d, "")
    _check_references(d)


def _fields(ndim: int, layout_of) -> dict:
    node_name = identifier
    seconds, size = number(), number(0.0, float(MAX_SIZE))
    return {
        "format_version": one_of(FORMAT_VERSION),
        "mesh": lambda v, p: None,  # checked first: the layouts' length comes from it
        "hardware": label,
        "graph": _graph(),
        "strategies": mapping(node_name, record({"in": list_of(layout_of), "out": list_of(layout_of),
                                                 "compute_s": seconds})),
        "redistributions": list_of(_redistribution(ndim, layout_of)),
        "predicted": record({"step_time_s": seconds, "compute_s": seconds, "communication_s": seconds,
                             "memory_bytes": mapping(identifier, size)},
                            {"sharded_flops_fraction": number(0.0, 1.0), "total_flops": number(),
                             "hidden_communication_s": seconds, "recompute_s": seconds, "bubble_s": seconds,
                             "memory_timeline": list_of(row(identifier, size))}),
        "fallback_nodes": mapping(node_name, op_target),
        "fallback_modules": mapping(node_name, module_path),
        "solver": record({"backend": label, "status": label, "objective_s": number(infinite=True),
                          "bound_s": number(infinite=True), "gap": number(infinite=True), "seconds": seconds,
                          "n_variables": integer()}, {"timed_out": boolean}),
        "history": list_of(record({"name": label, "seconds": seconds, "note": label})),
        "formula": nullable(record({"sizes": mapping(identifier, integer(1)), "compute_s": _expression,
                                    "communication_s": _expression,
                                    "collective_bytes": mapping(label, _expression)})),
        "recompute": list_of(identifier),
        "prefetch": boolean,
        "moe_imbalance": number(1.0, 1e6),
        "modules": mapping(node_name, module_path),
        "pipeline": nullable(_pipeline()),
        "offload": nullable(_offload()),
    }


def _graph():
    fqn_of = mapping(identifier, dotted)
    return record({
        "nodes": list_of(record({"name": identifier, "op": one_of(*NODE_OPS), "target": _target,
                                 "args": _arguments, "kwargs": mapping(identifier, _arguments),
                                 "outputs": list_of(nullable(record({"shape": list_of(integer(), 0, MAX_RANK),
                                                                     "dtype": dtype}))),
                                 "phase": one_of("forward", "backward")}), 1),
        "params": fqn_of, "buffers": fqn_of, "inputs": list_of(identifier), "loss": nullable(identifier),
        "grads": fqn_of, "outputs": list_of(nullable(identifier)),
    }, {  # added to the format after its first files
        "input_names": list_of(label), "training": boolean, "kind": one_of("step", "forward"), "modes": _modes,
        "frozen": list_of(dotted), "values": list_of(identifier), "mutated": fqn_of, "input_structure": text,
        "output_tree": nullable(record({"spec": text, "leaves": list_of(_output_leaf)})),
        "autocast": nullable(dtype), "tied": mapping(dotted, dotted),
    })


def _target(value, path: str) -> None:
    if value not in ("", "getitem"):
        op_target(value, path)


def _modes(value, path: str) -> None:
    if not isinstance(value, str) or set(value) - {"0", "1"} or len(value) > MAX_SIZE:
        fail(path, "must be a string of 0s and 1s (each module's training flag)")


def _arguments(value, path: str, depth: int = 0) -> None:
    """An op's argument: a number, a bool, None, a string (printed quoted), a list of arguments,
    a reference to a node ({"ref": name}) or a torch constant by name ({"dtype": "float32"})."""
    if value is None or isinstance(value, (bool, int)):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 63:
            fail(path, "is an integer out of the 64-bit range")
        return
    if isinstance(value, float):
        return  # printed by repr (or float('nan'), float('inf')): any float is safe and meaningful
    if isinstance(value, str):
        label(value, path)
        return
    if isinstance(value, list):
        if depth >= MAX_NESTING:
            fail(path, f"nests lists more than {MAX_NESTING} deep")
        for i, item in enumerate(value):
            _arguments(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, dict) and len(value) == 1:
        (key, inner), = value.items()
        if key == "ref":
            identifier(inner, f"{path}.ref")
            return
        if key in _ARGUMENT_OBJECTS:
            _ARGUMENT_OBJECTS[key](inner, f"{path}.{key}")
            return
    fail(path, "must be a number, a bool, null, a string, a list, {\"ref\": node} or {\"dtype\"|\"device\"|"
               "\"layout\"|\"memory_format\": name}")


def _output_leaf(value, path: str) -> None:
    if not isinstance(value, dict) or len(value) not in (1, 2):
        fail(path, "must be one of {loss}, {value, name}, {constant} or {dropped}")
    if "loss" in value:
        record({"loss": one_of(True)})(value, path)
    elif "value" in value:
        record({"value": integer(), "name": label})(value, path)
    elif "constant" in value:
        record({"constant": _json_leaf})(value, path)
    else:
        record({"dropped": label})(value, path)


def _json_leaf(value, path: str) -> None:
    if isinstance(value, str):
        label(value, path)
    elif not (value is None or isinstance(value, (bool, int, float))):
        fail(path, "must be a string, a number, a bool or null")


def _expression(value, path: str) -> None:
    """A cost formula's sympy expression, as srepr wrote it (read by autopar.ir.cost_formula's own
    parser, which builds only sympy numbers, symbols and arithmetic)."""
    from autopar.ir.cost_formula import parse_expression

    label(value, path, limit=1 << 24)
    try:
        parse_expression(value)
    except ValueError as exc:
        fail(path, f"is not a cost formula: {exc}")


def _redistribution(ndim: int, layout_of):
    axis, dim = integer(0, ndim - 1), nullable(integer(0, MAX_RANK - 1))
    return record({
        "id": identifier, "value": identifier, "src": layout_of, "dst": layout_of,
        "steps": list_of(row(one_of(*STEP_KINDS), axis, dim, dim)),
        "step_seconds": list_of(number()), "step_bytes": list_of(number(0.0, float(MAX_SIZE))),
        "phase": one_of("forward", "backward"), "consumers": list_of(identifier), "wire_dtype": nullable(dtype),
    })


def _pipeline():
    seconds, size = number(), number(0.0, float(MAX_SIZE))
    stage = record({"index": integer(), "rank": integer(), "units": list_of(label), "forward_s": seconds,
                    "backward_input_s": seconds, "backward_weight_s": seconds, "send_s": seconds, "sync_s": seconds,
                    "parameter_bytes": size, "optimizer_bytes": size, "activation_bytes": size,
                    "in_flight": integer()})
    work = record({"name": label, "kind": one_of("factor", "reduce", "invert", "precondition"), "stage": integer(),
                   "rank": integer(), "phase": integer(), "after": _after, "start_s": seconds, "end_s": seconds,
                   "layers": list_of(dotted)}, {"microbatch": integer(-1)})
    fill = record({"optimizer": one_of("kfac"), "refresh": integer(1), "margin_s": seconds, "layers": list_of(dotted),
                   "first_order": list_of(dotted), "work": list_of(work), "step_first_order_s": seconds,
                   "step_unfilled_s": seconds, "step_filled_s": seconds, "bubble_before": number(0.0, 1.0),
                   "bubble_after": number(0.0, 1.0), "factor_bytes": size})
    candidate = record({"schedule": one_of(*SCHEDULES), "microbatches": integer(1), "virtual": integer(1),
                        "step_time_s": number(infinite=True), "bubble_fraction": number(0.0, 1.0), "note": label})
    return record({
        "pp": integer(1, 1 << 16), "schedule": one_of(*SCHEDULES), "microbatches": integer(1, 1 << 20),
        "virtual": integer(1, 64), "stages": list_of(stage, 1), "step_time_s": seconds,
        "bubble_fraction": number(0.0, 1.0), "rank_peak_bytes": list_of(size),
        "timeline": list_of(record({"rank": integer(), "action": action, "start_s": seconds, "end_s": seconds})),
    }, {"candidates": list_of(candidate), "node_units": mapping(identifier, integer()), "fill": nullable(fill),
        "offload": nullable(record({"reason": label, "host_bytes": list_of(size), "up_bytes": list_of(size),
                                    "down_bytes": list_of(size), "optimizer_s": list_of(seconds)}))})


def _after(value, path: str) -> None:
    if value not in ("start", "end", "tail"):
        action(value, path)


def _offload():
    size = number(0.0, float(MAX_SIZE))
    chunk = record({"index": integer(), "dtype": dtype, "capacity": integer(), "params": list_of(dotted),
                    "offsets": list_of(integer()), "numels": list_of(integer()), "itemsize": integer(1, 64)})
    return record({
        "chunks": list_of(chunk), "moves": list_of(row(integer(), one_of("fetch", "evict"), integer())),
        "slots": integer(), "optimizer": record({"place": one_of("host", "device"), "host_s": number(),
                                                  "device_s": number(), "device_bytes": size}),
        "transfer_s": number(), "exposed_s": number(), "device_bytes": list_of(size), "host_bytes": size,
        "reason": label,
    })


def _check_references(d: dict) -> None:
    """Every name a field uses for a node is a node of the graph; node names are distinct; every
    node has a layout for each of its inputs and outputs, within its tensors' dims."""
    nodes = d["graph"]["nodes"]
    names: set = set()
    outputs: dict = {}
    for i, node in enumerate(nodes):
        if node["name"] in names:
            fail(f"graph.nodes[{i}].name", f"repeats the name {node['name']!r}")
        refs = _check_refs(node["args"], f"graph.nodes[{i}].args", names, []) + \
            _check_refs(node["kwargs"], f"graph.nodes[{i}].kwargs", names, [])
        if node["target"] == "getitem":
            inputs = [_item(node, outputs, f"graph.nodes[{i}].args")]
        else:
            inputs = [outputs[r][0] if outputs[r] else None for r in refs]
        if node["op"] == "output":
            if i != len(nodes) - 1:
                fail(f"graph.nodes[{i}].op", "is 'output', which only the last node is")
        else:
            _check_layouts(d, node, inputs, f"strategies.{node['name']}")
        names.add(node["name"])
        outputs[node["name"]] = node["outputs"]
    if nodes[-1]["op"] != "output":
        fail(f"graph.nodes[{len(nodes) - 1}].op", "must be 'output': the graph ends with its outputs")
    _check_named_nodes(d, names)
    _check_returns(d["graph"])
    _check_redistributions(d, names)


def _check_returns(graph: dict) -> None:
    """The forward returns something, and its loss where the graph says it has one: a training
    step's loss (it differentiates it), as the output tree's loss leaf says."""
    loss = graph["loss"]
    if graph.get("kind", "step") == "step" and loss is None:
        fail("graph.loss", "must name the loss of a training step's graph (backward differentiates it)")
    if loss is None and not graph.get("values") and not graph.get("mutated"):
        fail("graph.loss", "is null and the graph returns no values and no buffers: its forward returns nothing")
    tree = graph.get("output_tree")
    if tree is not None and any("loss" in leaf for leaf in tree["leaves"]) != (loss is not None):
        fail("graph.loss", "must name a node exactly where graph.output_tree has a loss leaf")


def _check_layouts(d: dict, node: dict, inputs: list, path: str) -> None:
    """The node's strategy: a layout per input and per output, each splitting dims its tensor
    has, evenly over the mesh axes."""
    strategy = d["strategies"].get(node["name"])
    if strategy is None:
        fail("strategies", f"has no layout for node {node['name']!r}")
    if len(strategy["in"]) != len(inputs) or len(strategy["out"]) != len(node["outputs"]):
        fail(path, f"gives {len(strategy['in'])} input and {len(strategy['out'])} output layouts to a node of "
                   f"{len(inputs)} tensor inputs and {len(node['outputs'])} outputs")
    for which, specs, metas in (("in", strategy["in"], inputs), ("out", strategy["out"], node["outputs"])):
        for j, (text_, meta) in enumerate(zip(specs, metas)):
            _check_split(text_, meta, d["mesh"]["shape"], f"{path}.{which}[{j}]")


def _check_split(spec_text: str, meta, mesh_shape: list, path: str) -> None:
    for axis, placement in enumerate(spec_text.split(",")):
        if placement.startswith("S("):
            dim = int(placement[2:-1])
            if meta is None or dim >= len(meta["shape"]):
                fail(path, f"splits dim {dim} over mesh axis {axis}, which its value does not have")
            if meta["shape"][dim] % mesh_shape[axis]:
                fail(path, f"splits dim {dim} of size {meta['shape'][dim]} over mesh axis {axis}, which does not "
                           f"divide it")


def _item(node: dict, outputs: dict, path: str):
    """The meta of the output that getitem(ref, i) reads."""
    args = node["args"]
    if not (isinstance(args, list) and len(args) == 2 and isinstance(args[0], dict) and set(args[0]) == {"ref"}
            and isinstance(args[1], int) and not isinstance(args[1], bool)
            and 0 <= args[1] < len(outputs[args[0]["ref"]])):
        fail(path, "must be [{\"ref\": node}, index] for getitem, the index one of that node's outputs")
    return outputs[args[0]["ref"]][args[1]]


def _check_named_nodes(d: dict, names: set) -> None:
    """The fields that name nodes name nodes of the graph."""
    graph = d["graph"]
    placeholders = [n["name"] for n in graph["nodes"] if n["op"] == "placeholder"]
    roles = list(graph["params"]) + list(graph["buffers"]) + list(graph["inputs"])
    if sorted(roles) != sorted(placeholders):
        fail("graph.params", "with graph.buffers and graph.inputs must name each placeholder of the graph once")
    fqns = {"graph.grads": (graph["grads"].values(), set(graph["params"].values()), "parameter"),
            "graph.mutated": (graph.get("mutated", {}).values(), set(graph["buffers"].values()), "buffer"),
            "graph.frozen": (graph.get("frozen", []), set(graph["params"].values()), "parameter"),
            "graph.tied": (list(graph.get("tied", {})) + list(graph.get("tied", {}).values()),
                           set(graph["params"].values()), "parameter")}
    for path, (used, known, what) in fqns.items():
        wrong = [f for f in used if f not in known]
        if wrong:
            fail(path, f"names {wrong[0]!r}, which is no {what} of the graph")
    named = [("graph.params", graph["params"]), ("graph.buffers", graph["buffers"]), ("graph.grads", graph["grads"]),
             ("graph.mutated", graph.get("mutated", {})), ("strategies", d["strategies"]),
             ("fallback_nodes", d["fallback_nodes"]), ("fallback_modules", d.get("fallback_modules", {})),
             ("modules", d.get("modules", {}))]
    named += [("graph.inputs", graph["inputs"]), ("graph.values", graph.get("values", [])),
              ("graph.outputs", [o for o in graph["outputs"] if o is not None]),
              ("graph.loss", [graph["loss"]] if graph["loss"] is not None else [])]
    named += [(f"redistributions[{i}].value", [r["value"]]) for i, r in enumerate(d["redistributions"])]
    for path, used in named:
        missing = [n for n in used if n not in names]
        if missing:
            fail(path, f"names {missing[0]!r}, which is no node of the graph")


def _check_redistributions(d: dict, names: set) -> None:
    metas = {n["name"]: n["outputs"][0] if n["outputs"] else None for n in d["graph"]["nodes"]}
    for i, r in enumerate(d["redistributions"]):
        wrong = [c for c in r["consumers"] if c not in names and c not in ("output", "update")]
        if wrong:
            fail(f"redistributions[{i}].consumers", f"names {wrong[0]!r}, which is no node of the graph")
        for which in ("src", "dst"):
            _check_split(r[which], metas[r["value"]], d["mesh"]["shape"], f"redistributions[{i}].{which}")
        if len(r["step_seconds"]) != len(r["steps"]) or len(r["step_bytes"]) != len(r["steps"]):
            fail(f"redistributions[{i}]", "must give each step its seconds and bytes")


def _check_refs(value, path: str, defined: set, found: list) -> list:
    """The nodes ``value`` refers to, in order; each must be defined before."""
    if isinstance(value, dict):
        if set(value) == {"ref"}:
            if value["ref"] not in defined:
                fail(f"{path}.ref", f"names {value['ref']!r}, which is no node defined before it")
            found.append(value["ref"])
        for k, v in value.items():
            if k != "ref":
                _check_refs(v, f"{path}.{k}", defined, found)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_refs(v, f"{path}[{i}]", defined, found)
    return found
