"""The cost model: collective formulas against hand-computed values, topology,
hardware spec files, and FLOPs against the published GPT formula."""
import dataclasses
import json

import pytest
import torch

import autopar
from autopar.cost_models.collectives import AxisPlacement, axis_placement, collective_time
from autopar.cost_models.hardware import Hardware, Link, get_hardware, save_hardware
from autopar.cost_models.model import CostModel
from autopar.errors import AutoparError
from autopar.ir.mesh import Mesh
from examples import gpt2, mlp

# 4 devices a node; NVLink-like inside (1 us, 100 GB/s), network across (5 us, 10 GB/s)
HW = Hardware("test", 100e12, 80e9, 2e12, intra_node=Link(100e9, 1e-6), inter_node=Link(10e9, 5e-6),
              devices_per_node=4)
N = 8e6  # bytes


@pytest.mark.parametrize("kind, expected", [
    ("all_reduce", 2 * 3 * 1e-6 + 2 * 3 / 4 * N / 100e9),  # 6 us + 120 us
    ("all_gather", 3 * 1e-6 + 3 / 4 * N / 100e9),
    ("reduce_scatter", 3 * 1e-6 + 3 / 4 * N / 100e9),
    ("all_to_all", 3 * 1e-6 + 3 / 4 * N / 100e9),
])
def test_ring_formulas_inside_a_node(kind, expected):
    assert collective_time(kind, N, AxisPlacement(4, 4), HW) == pytest.approx(expected, rel=1e-12)
    assert collective_time(kind, N, AxisPlacement(4, 4), HW) == pytest.approx(
        {"all_reduce": 126e-6}.get(kind, 63e-6), rel=1e-12)


def test_an_axis_of_one_device_per_node_rings_over_the_network():
    assert collective_time("all_reduce", N, AxisPlacement(2, 1), HW) == pytest.approx(2 * 5e-6 + N / 10e9)


def test_hierarchical_collectives_across_two_nodes():
    where = AxisPlacement(8, 4)  # 4 devices in each of 2 nodes
    rs_inside = 3e-6 + 0.75 * N / 100e9  # 63 us
    ar_across = 2 * 5e-6 + 2 * 0.5 * (N / 4) / 10e9  # 210 us on a quarter of the buffer
    ag_across = 5e-6 + 0.5 * (N / 4) / 10e9  # 105 us
    assert collective_time("all_reduce", N, where, HW) == pytest.approx(rs_inside + ar_across + rs_inside)
    assert collective_time("all_reduce", N, where, HW) == pytest.approx(336e-6)
    assert collective_time("reduce_scatter", N, where, HW) == pytest.approx(rs_inside + ag_across)
    assert collective_time("all_gather", N, where, HW) == pytest.approx(ag_across + rs_inside)
    # all-to-all: 3/8 of the buffer stays in the node, 4/8 crosses
    assert collective_time("all_to_all", N, where, HW) == pytest.approx(3e-6 + 3 / 8 * N / 100e9
                                                                         + 5e-6 + 4 / 8 * N / 10e9)


def test_mesh_axes_are_laid_innermost_first_onto_nodes():
    assert axis_placement(Mesh.parse("a=2,b=4"), 1, HW) == AxisPlacement(4, 4)  # b fills a node
    assert axis_placement(Mesh.parse("a=2,b=4"), 0, HW) == AxisPlacement(2, 1)  # a crosses nodes
    assert axis_placement(Mesh.parse("b=4,a=2"), 0, HW) == AxisPlacement(4, 2)  # b: 2 per node, 2 nodes
    assert axis_placement(Mesh.parse("b=4,a=2"), 1, HW) == AxisPlacement(2, 2)


def test_an_axis_across_nodes_costs_more_than_inside():
    from autopar.ir.placement import P, R, Spec
    from autopar.ir.program import TensorMeta

    h100 = autopar.PRESETS["h100-sxm"]
    cost = CostModel(Mesh.parse("a=4,b=4"), h100)  # 16 devices, 8 a node: b inside, a 2 per node
    meta = TensorMeta((4096, 4096), "float32")
    across = cost.reshard_time(meta, Spec((P, R)), Spec((R, R)))
    inside = cost.reshard_time(meta, Spec((R, P)), Spec((R, R)))
    assert across > 3 * inside


def test_solver_lays_critical_path_traffic_inside_a_node():
    """2 nodes x 2 H100s: a wide MLP runs data-parallel over one axis and tensor-parallel over
    the other; the traffic that cannot overlap compute (all but the gradient syncs) takes the
    intra-node axis, whichever way round the mesh is written, and the step is priced the same."""
    hw = dataclasses.replace(autopar.PRESETS["h100-sxm"], devices_per_node=2)
    with torch.device("meta"):
        model, inputs = mlp.make(batch=16384, width=8192, hidden=32768)
    times = []
    for mesh, inside in (("a=2,b=2", "b"), ("b=2,a=2", "a")):
        plan = autopar.plan(model, inputs, mesh=mesh, hardware=hw)
        exposed: dict = {}
        for r, i in plan.collectives():
            if not (r.is_async and i == 0):
                name = plan.mesh.axis_names[r.steps[i].axis]
                exposed[name] = exposed.get(name, 0) + r.step_bytes[i]
        assert max(exposed, key=exposed.get) == inside, (mesh, exposed)
        assert {plan.mesh.axis_names[r.steps[i].axis] for r, i in plan.collectives()} == {"a", "b"}  # none idle
        times.append(plan.predicted.step_time_s)
    assert times[0] == pytest.approx(times[1])


def test_tensor_parallelism_takes_the_intra_node_axis_on_two_h100_nodes():
    """2 nodes x 8 H100s, a model with large activations (65536 tokens through a 8192-wide MLP).
    Tensor parallelism's activation collectives sit on the critical path, while gradient syncs
    run under the backward pass: the weights split over the axis inside a node, and the axis
    across nodes carries only (overlapped) gradient syncs. Both ways of writing the mesh."""
    with torch.device("meta"):
        model, inputs = mlp.make(batch=65536, width=8192, hidden=32768)
    for mesh in ("a=2,b=8", "b=8,a=2"):  # the innermost axis lies inside a node: b, then a
        plan = autopar.plan(model, inputs, mesh=mesh, hardware="h100-sxm")
        intra = plan.mesh.ndim - 1
        inter = 1 - intra
        assert axis_placement(plan.mesh, intra, autopar.PRESETS["h100-sxm"]).nodes == 1
        for fqn in ("fc1.weight", "fc2.weight"):
            placements = plan.param_spec(fqn).placements
            assert isinstance(placements[intra], autopar.Shard), (mesh, fqn, plan.param_spec(fqn))
            assert isinstance(placements[inter], autopar.Replicate), (mesh, fqn, plan.param_spec(fqn))
        # across nodes: gradient syncs, and the loss (a scalar) summed on its way out
        blocking = [r for r, i in plan.collectives() if r.steps[i].axis == inter and not (r.is_async and i == 0)]
        assert sum(r.step_bytes[i] for r in blocking for i in range(len(r.steps))) <= 64, (mesh, blocking)
        assert any(r.is_async for r, i in plan.collectives() if r.steps[i].axis == inter)
        assert plan.predicted.hidden_communication_s > 0


def test_hardware_spec_files_round_trip(tmp_path):
    path = tmp_path / "cluster.json"
    save_hardware(HW, path)
    assert get_hardware(str(path)) == HW
    yaml_path = tmp_path / "cluster.yaml"
    yaml_path.write_text("name: yaml-box\npeak_flops: 1.0e+12\nmemory_bytes: 1.0e+9\nmemory_bandwidth: 1.0e+10\n"
                         "intra_node: {bandwidth: 1.0e+9, latency: 1.0e-5}\n"
                         "inter_node: {bandwidth: 1.0e+8, latency: 1.0e-4}\ndevices_per_node: 4\n")
    loaded = get_hardware(str(yaml_path))
    assert loaded.intra_node == Link(1e9, 1e-5) and loaded.devices_per_node == 4
    plan = autopar.plan(*mlp.make(batch=8, width=16, hidden=32), mesh="dp=2", hardware=str(path))
    assert plan.hardware == "test"


def test_bad_hardware_specs_say_what_is_wrong(tmp_path):
    with pytest.raises(AutoparError, match="unknown hardware 'h900'"):
        get_hardware("h900")
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"name": "x", "peak_flops": 1e12}))
    with pytest.raises(AutoparError, match="incomplete"):
        get_hardware(str(missing))
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({**json.loads(HW.to_json()), "peak_flop": 1}))
    with pytest.raises(AutoparError, match="unknown field.*peak_flop"):
        get_hardware(str(typo))
    with pytest.raises(AutoparError, match="cannot read"):
        get_hardware(str(tmp_path / "absent.json"))


def test_small_kernels_reach_a_lower_fraction_of_peak():
    h100 = autopar.PRESETS["h100-sxm"]
    assert h100.efficiency(1e7) < 0.1 * h100.compute_efficiency
    assert h100.efficiency(1e12) > 0.99 * h100.compute_efficiency


def test_training_flops_match_the_megatron_formula():
    """Narayanan et al. 2021, eq. 3: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) per iteration without recomputation."""
    cfg = gpt2.GPT2Config(vocab=51200, seq=2048, layers=2, heads=16, width=2048, batch=2)
    model, inputs = gpt2.make(cfg, device="meta")
    plan = autopar.plan(model, inputs, mesh="dp=1")
    b, s, l, h, v = cfg.batch, cfg.seq, cfg.layers, cfg.width, cfg.vocab
    formula = 72 * b * s * l * h ** 2 * (1 + s / (6 * h) + v / (12 * l * h))
    assert plan.predicted.total_flops == pytest.approx(formula, rel=0.02)


def test_compute_time_uses_the_efficiency_curve():
    h100 = dataclasses.replace(autopar.PRESETS["h100-sxm"], kernel_floor_s=0.0)
    flat = dataclasses.replace(h100, half_efficiency_flops=0.0)
    small = h100.half_efficiency_flops  # reaches half the efficiency: twice the time
    assert CostModel(Mesh.parse("dp=1"), h100).op_time(small, 0, 2) == pytest.approx(
        2 * CostModel(Mesh.parse("dp=1"), flat).op_time(small, 0, 2))


def test_calibration_fits_recover_known_parameters():
    from autopar.cost_models.calibrate import fit_compute, fit_link, ring_terms

    rate, half = 50e9, 2e6
    samples = [(f, (f + half) / rate) for f in (1e6, 1e7, 1e8, 1e9)]
    fitted_rate, fitted_half = fit_compute(samples)
    assert fitted_rate == pytest.approx(rate) and fitted_half == pytest.approx(half)
    alpha, beta, floor = 30e-6, 1 / 2e9, 5e-6
    for launch in (0.0, 1e-3):  # without and with a fixed cost per call (gloo on shared cores)
        measured = []
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            for p in (2, 4):
                for n in (4e3, 1e6, 4e6):
                    a, b = ring_terms(kind, p, n)
                    measured.append((kind, p, n, floor + launch + a * alpha + b * beta))
        assert fit_link(measured, floor) == pytest.approx((launch, alpha, beta), abs=1e-12, rel=1e-6)


def test_host_link_fit_recovers_latency_and_bandwidth():
    from autopar.cost_models.calibrate import fit_host_link

    latency, bandwidth = 40e-6, 6e9
    samples = [(n, latency + n / bandwidth) for n in (1 << 20, 4 << 20, 16 << 20, 64 << 20)]
    link = fit_host_link(samples)
    assert isinstance(link, Link)
    assert (link.latency, link.bandwidth) == pytest.approx((latency, bandwidth), rel=1e-6)
    # noise that would make the intercept negative: latency 0, bandwidth through the origin
    assert fit_host_link([(1e6, 1.0e-4), (1e7, 2.0e-3)]).latency == 0.0


def test_hardware_json_round_trips_the_offload_fields():
    for name, hw in autopar.PRESETS.items():
        back = Hardware.from_dict(json.loads(hw.to_json()), source=name)
        assert back == hw and isinstance(back.host_link, Link)
    calibrated = dataclasses.replace(HW, host_link=Link(3e9, 2e-5), host_memory_bytes=64e9,
                                     host_optimizer_rate=2e8, host_copies_overlap=False)
    assert Hardware.from_dict(json.loads(calibrated.to_json())) == calibrated


def test_every_collective_call_pays_the_library_launch():
    """A two-step move (all-gather on each axis) pays the launch twice; the presets pay none."""
    from autopar.ir.placement import Spec
    from autopar.ir.program import TensorMeta

    assert all(hw.collective_launch_s == 0 for hw in autopar.PRESETS.values())
    meta = TensorMeta((64, 64), "float32")
    src, dst = Spec.from_json("S(0),S(1)"), Spec.from_json("R,R")
    mesh = Mesh.parse("dp=2,tp=2")
    plain = CostModel(mesh, HW).reshard_time(meta, src, dst)
    launched = CostModel(mesh, dataclasses.replace(HW, collective_launch_s=1e-3)).reshard_time(meta, src, dst)
    assert launched - plain == pytest.approx(2e-3)


def test_calibration_times_collectives_in_groups_with_every_rank_busy():
    """Groups of 2 on 4 processes run at once on every rank (two groups side by side), as a mesh
    axis's groups do in a program; a group size that does not divide the world is refused."""
    from autopar.cost_models.calibrate import _measure_collectives, calibrate
    from autopar.runtime.local_cluster import get_cluster

    per_rank = get_cluster(4).run(_measure_collectives, 2, (4 << 10,))
    assert len(per_rank) == 4
    for rows in per_rank:
        assert sorted(kind for kind, _, _ in rows) == ["all_gather", "all_reduce", "all_to_all", "reduce_scatter"]
        assert all(nbytes == 4 << 10 and seconds > 0 for _, nbytes, seconds in rows)
    with pytest.raises(AutoparError, match="divide the largest"):
        calibrate((3, 4))


def test_pinned_parameters_keep_their_layout_and_bad_pins_are_refused():
    model, inputs = mlp.make(batch=8, width=64, hidden=256)
    plan = autopar.plan(model, inputs, mesh="tp=4", pin={"fc1.weight": "S(1)"})
    assert plan.param_spec("fc1.weight").to_json() == "S(1)"
    with pytest.raises(AutoparError, match="names no parameter, module or node"):
        autopar.plan(model, inputs, mesh="tp=4", pin={"fc9.weight": "R"})
    with pytest.raises(AutoparError, match="its layouts are"):
        autopar.plan(model, inputs, mesh="tp=4", pin={"fc1.weight": "S(0),R"})


def test_collectives_the_library_lacks_are_priced_as_the_runtime_composes_them():
    gloo_like = dataclasses.replace(HW, emulated_collectives=("reduce_scatter", "all_to_all"))
    where = AxisPlacement(4, 4)
    assert collective_time("reduce_scatter", N, where, gloo_like) == collective_time("all_reduce", N, where, HW)
    # all-to-all becomes an all-gather of every rank's whole buffer: 4 N gathered
    assert collective_time("all_to_all", N, where, gloo_like) == pytest.approx(3e-6 + 3 / 4 * 4 * N / 100e9)


def test_cpu_hardware_reads_the_calibrated_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPAR_CACHE", str(tmp_path))
    with pytest.raises(AutoparError, match="autopar calibrate"):
        get_hardware("cpu")
    save_hardware(HW, tmp_path / "cpu.json")
    assert get_hardware("cpu") == dataclasses.replace(HW, collectives_library="gloo")  # CPU processes run gloo


def test_a_bucketed_gradient_sync_pays_its_byte_share_of_one_calls_fixed_costs():
    """Gradient syncs go out in buckets (autopar.runtime.rank_mesh): a small gradient's all-reduce
    pays the bandwidth of its bytes and its share of the bucket's latency and launch; a gradient
    as large as a bucket pays a whole call."""
    from autopar.ir.placement import Partial, Replicate, Spec
    from autopar.ir.program import TensorMeta

    hw = dataclasses.replace(get_hardware("h100-sxm"), collective_launch_s=1e-3, gradient_bucket_bytes=2**20)
    cost = CostModel(Mesh.of(dp=4), hw)
    src, dst = Spec((Partial(),)), Spec((Replicate(),))
    small, large = TensorMeta((2**10,), "float32"), TensorMeta((2**18,), "float32")  # 4 KiB, one bucket
    where = axis_placement(cost.mesh, 0, hw)
    fixed = collective_time("all_reduce", 0.0, where, hw) + hw.kernel_floor_s + hw.collective_launch_s
    alone = cost.reshard_time(small, src, dst)
    assert cost.reshard_time(small, src, dst, bucketed=True) == pytest.approx(
        alone - fixed * (1 - small.nbytes / hw.gradient_bucket_bytes))
    assert cost.async_time(small, src, dst) == pytest.approx(cost.reshard_time(small, src, dst, bucketed=True))
    assert cost.reshard_time(large, src, dst, bucketed=True) == pytest.approx(cost.reshard_time(large, src, dst))
