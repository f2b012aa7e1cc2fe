# autopar: per-rank training step for torch.distributed (generated; do not edit)
# plan 035930c0d258 | graph 91e517f7f5293b96 | mesh (dp=2, tp=2) | hardware h100-sxm
# predicted step 0.0439 ms = compute 0.0398 ms + communication 0.0041 ms
# passes:
#   shapes: 29 nodes
#   strategies: 29 nodes, 16 free, 168 strategies, 0 fallbacks
#   cluster_layers: no repeated layers
#   solve_sharding: 16 variables groups, 25 edges, 3136 booleans, optimal, objective 0.0480 ms, gap 0.00%
#   collectives: 2 redistributions, 1 collectives
#   recompute: peak 67.3 MB per device at sum_2
#   predict: step 0.0439 ms (compute 0.0398, communication 0.0041 + 0.0000 hidden), 100% of FLOPs sharded
# forward(rt, parameters..., buffers..., inputs...) -> (loss, saved, values, {buffer name: new value})
# backward(rt, parameters..., buffers..., inputs..., saved, grad_loss, sync, unsynced)
#     -> {parameter name: gradient}
# all on this rank's local shards; saved: the values forward keeps for backward;
# values: the model's other outputs, in their planned layouts.
import torch

aten = torch.ops.aten

PLAN_HASH = '035930c0d258'
GRAPH_FINGERPRINT = '91e517f7f5293b96'
PLACEHOLDERS = ['fc1_weight', 'fc1_bias', 'fc2_weight', 'fc2_bias', 'x', 'y']


def forward(rt, fc1_weight, fc1_bias, fc2_weight, fc2_bias, x, y):
    # fc1_weight (parameter fc1.weight): [4096, 1024] -> local [2048, 1024] (R, S(0))
    # fc1_bias (parameter fc1.bias): [4096] -> local [2048] (R, S(0))
    # fc2_weight (parameter fc2.weight): [1024, 4096] -> local [1024, 2048] (R, S(1))
    # fc2_bias (parameter fc2.bias): [1024] -> local [1024] (R, R)
    # x (input): [8, 1024] -> local [8, 1024] (R, R)
    # y (input): [8, 1024] -> local [8, 1024] (R, R)

    # ---- forward ----
    # fc1
    t = aten.t.default(fc1_weight)  # [1024, 4096] -> local [1024, 2048] (R, S(1))
    addmm = aten.addmm.default(fc1_bias, x, t)  # [8, 4096] -> local [8, 2048] (R, S(1))
    del t
    # <model>
    gelu = aten.gelu.default(addmm)  # [8, 4096] -> local [8, 2048] (R, S(1))
    # fc2
    t_1 = aten.t.default(fc2_weight)  # [4096, 1024] -> local [2048, 1024] (R, S(0))
    fc2_bias__r0 = rt.zero_partial(fc2_bias, 'tp')  # r0 forward: (R, R) -> (R, P), 0 B, 0.0 us
    addmm_1 = aten.addmm.default(fc2_bias__r0, gelu, t_1)  # [8, 1024] -> local [8, 1024] (R, P)
    del t_1, fc2_bias__r0
    addmm_1__r1 = rt.all_reduce(addmm_1, 'tp', last_read=True)  # r1 forward: (R, P) -> (R, R), 32.8 KB, 4.1 us
    del addmm_1
    # <model>
    sub = aten.sub.Tensor(addmm_1__r1, y)  # [8, 1024] -> local [8, 1024] (R, R)
    pow_1 = aten.pow.Tensor_Scalar(sub, 2)  # [8, 1024] -> local [8, 1024] (R, R)
    del sub
    sum_dim_int_list = aten.sum.dim_IntList(pow_1, [0, 1], False)  # [] -> local [] (R, R)
    del pow_1
    div_scalar = aten.div.Scalar(sum_dim_int_list, 8192)  # [] -> local [] (R, R)
    del sum_dim_int_list
    return (
        div_scalar,
        [addmm, gelu, addmm_1__r1, div_scalar],  # saved for backward
        [],  # the model's other outputs
        {},  # the buffers' new values
    )


def backward(rt, fc1_weight, fc1_bias, fc2_weight, fc2_bias, x, y, saved, grad_loss, sync, unsynced):
    [addmm, gelu, addmm_1__r1, div_scalar] = saved  # the values forward kept for backward
    saved.clear()  # held here alone now: each is freed after its last use

    # ---- backward ----
    # <model>
    ones_like_default = grad_loss  # d(loss)/d(loss): what autograd hands backward (1 for loss.backward())
    del div_scalar
    # fc2
    sub_1 = aten.sub.Tensor(addmm_1__r1, y)  # [8, 1024] -> local [8, 1024] (R, R)
    del addmm_1__r1
    mul = aten.mul.Tensor(sub_1, 0.000244140625)  # [8, 1024] -> local [8, 1024] (R, R)
    del sub_1
    mul_1 = aten.mul.Tensor(mul, ones_like_default)  # [8, 1024] -> local [8, 1024] (R, R)
    del ones_like_default, mul
    mm = aten.mm.default(mul_1, fc2_weight)  # [8, 4096] -> local [8, 2048] (R, S(1))
    t_3 = aten.t.default(mul_1)  # [1024, 8] -> local [1024, 8] (R, R)
    # <model>
    grad_fc2_weight = aten.mm.default(t_3, gelu)  # [1024, 4096] -> local [1024, 2048] (R, S(1))
    del gelu, t_3
    # fc2
    sum_1 = aten.sum.dim_IntList(mul_1, [0], True)  # [1, 1024] -> local [1, 1024] (R, R)
    del mul_1
    grad_fc2_bias = aten.reshape.default(sum_1, [1024])  # [1024] -> local [1024] (R, R)
    del sum_1
    # fc1
    gelu_backward = aten.gelu_backward.default(mm, addmm)  # [8, 4096] -> local [8, 2048] (R, S(1))
    del addmm, mm
    t_6 = aten.t.default(gelu_backward)  # [4096, 8] -> local [2048, 8] (R, S(0))
    grad_fc1_weight = aten.mm.default(t_6, x)  # [4096, 1024] -> local [2048, 1024] (R, S(0))
    del t_6
    sum_2 = aten.sum.dim_IntList(gelu_backward, [0], True)  # [1, 4096] -> local [1, 2048] (R, S(1))
    del gelu_backward
    grad_fc1_bias = aten.reshape.default(sum_2, [2048])  # [4096] -> local [2048] (R, S(0))
    del sum_2
    if not sync:  # model.no_sync(): the local gradients, left for the next synced backward
        return {
            'fc1.weight': grad_fc1_weight,
            'fc1.bias': grad_fc1_bias,
            'fc2.weight': grad_fc2_weight,
            'fc2.bias': grad_fc2_bias,
        }
    return {
        'fc1.weight': accumulate(grad_fc1_weight, unsynced, 'fc1.weight'),
        'fc1.bias': accumulate(grad_fc1_bias, unsynced, 'fc1.bias'),
        'fc2.weight': accumulate(grad_fc2_weight, unsynced, 'fc2.weight'),
        'fc2.bias': accumulate(grad_fc2_bias, unsynced, 'fc2.bias'),
    }


def accumulate(grad, unsynced, name):
    """``grad`` plus the local gradient of ``name`` that earlier micro-batches left unsynced (no_sync)."""
    earlier = unsynced.pop(name, None)
    return grad if earlier is None else grad + earlier
