# autopar: per-rank training step for torch.distributed (generated; do not edit)
# plan ec5d9820ef89 | graph dc28b4143eb773f4 | mesh (dp=2, tp=2) | hardware h100-sxm
# predicted step 0.2268 ms = compute 0.1941 ms + communication 0.0326 ms
# parameter layouts (S(d): split along dim d; R: replicated):
#   fc1.weight  [4096, 1024]  R on dp, S(0) on tp
#   fc1.bias    [4096]        R on dp, S(0) on tp
#   fc2.weight  [1024, 4096]  R on dp, S(1) on tp
#   fc2.bias    [1024]        R on dp, R on tp
# passes:
#   shapes: 29 nodes
#   strategies: 29 nodes, 16 free, 168 strategies, 0 fallbacks
#   cluster_layers: no repeated layers
#   solve_sharding: 16 variables groups, 25 edges, 3268 booleans, optimal, objective 0.2391 ms, gap 0.00%
#   collectives: 8 redistributions, 8 collectives
#   recompute: peak 130.1 MB per device at mm_1
#   predict: step 0.2268 ms (compute 0.1941, communication 0.0326 + 0.0399 hidden), 100% of FLOPs sharded
# forward(rt, parameters..., buffers..., inputs...) -> (loss, saved, values, {buffer name: new value})
# backward(rt, parameters..., buffers..., inputs..., saved, grad_loss, sync, unsynced)
#     -> {parameter name: gradient}
# all on this rank's local shards; saved: the values forward keeps for backward;
# values: the model's other outputs, in their planned layouts.
import torch

aten = torch.ops.aten

PLAN_HASH = 'ec5d9820ef89'
GRAPH_FINGERPRINT = 'dc28b4143eb773f4'
PLACEHOLDERS = ['fc1_weight', 'fc1_bias', 'fc2_weight', 'fc2_bias', 'x', 'y']


def forward(rt, fc1_weight, fc1_bias, fc2_weight, fc2_bias, x, y):
    # fc1_weight (parameter fc1.weight): [4096, 1024] -> local [2048, 1024] (R, S(0))
    # fc1_bias (parameter fc1.bias): [4096] -> local [2048] (R, S(0))
    # fc2_weight (parameter fc2.weight): [1024, 4096] -> local [1024, 2048] (R, S(1))
    # fc2_bias (parameter fc2.bias): [1024] -> local [1024] (R, R)
    # x (input): [4096, 1024] -> local [2048, 1024] (S(0), R)
    # y (input): [4096, 1024] -> local [2048, 512] (S(0), S(1))

    # ---- forward ----
    # fc1
    fc1_t = aten.t.default(fc1_weight)  # [1024, 4096] -> local [1024, 2048] (R, S(1))
    fc1_addmm = aten.addmm.default(fc1_bias, x, fc1_t)  # [4096, 4096] -> local [2048, 2048] (S(0), S(1))
    del fc1_t
    # <model>
    gelu = aten.gelu.default(fc1_addmm)  # [4096, 4096] -> local [2048, 2048] (S(0), S(1))
    # fc2
    fc2_t = aten.t.default(fc2_weight)  # [4096, 1024] -> local [2048, 1024] (R, S(0))
    fc2_bias__r0 = rt.zero_partial(fc2_bias, 'tp')  # r0 forward: (R, R) -> (R, P), 0 B, 0.0 us
    fc2_addmm = aten.addmm.default(fc2_bias__r0, gelu, fc2_t)  # [4096, 1024] -> local [2048, 1024] (S(0), P)
    del fc2_t, fc2_bias__r0
    fc2_addmm__r1 = rt.reduce_scatter(fc2_addmm, 'tp', dim=1, last_read=True)  # r1 forward: (S(0), P) -> (S(0), S(1)), 8.4 MB, 12.3 us
    del fc2_addmm
    # <model>
    sub = aten.sub.Tensor(fc2_addmm__r1, y)  # [4096, 1024] -> local [2048, 512] (S(0), S(1))
    pow_1 = aten.pow.Tensor_Scalar(sub, 2)  # [4096, 1024] -> local [2048, 512] (S(0), S(1))
    del sub
    sum_dim_int_list = aten.sum.dim_IntList(pow_1, [0, 1], False)  # [] -> local [] (P, P)
    del pow_1
    sum_dim_int_list__r2 = rt.all_reduce(sum_dim_int_list, 'dp', last_read=True)  # r2 forward: (P, P) -> (R, R), 4 B, 4.0 us
    del sum_dim_int_list
    sum_dim_int_list__r2 = rt.all_reduce(sum_dim_int_list__r2, 'tp')  # r2 forward: (P, P) -> (R, R), 4 B, 4.0 us
    div_scalar = aten.div.Scalar(sum_dim_int_list__r2, 4194304)  # [] -> local [] (R, R)
    del sum_dim_int_list__r2
    return (
        div_scalar,
        [fc1_addmm, gelu, fc2_addmm__r1, div_scalar],  # saved for backward
        [],  # the model's other outputs
        {},  # the buffers' new values
    )


def backward(rt, fc1_weight, fc1_bias, fc2_weight, fc2_bias, x, y, saved, grad_loss, sync, unsynced):
    [fc1_addmm, gelu, fc2_addmm__r1, div_scalar] = saved  # the values forward kept for backward
    saved.clear()  # held here alone now: each is freed after its last use

    # ---- backward ----
    # <model>
    ones_like_default = grad_loss  # d(loss)/d(loss): what autograd hands backward (1 for loss.backward())
    del div_scalar
    sub_1 = aten.sub.Tensor(fc2_addmm__r1, y)  # [4096, 1024] -> local [2048, 512] (S(0), S(1))
    del fc2_addmm__r1
    mul = aten.mul.Tensor(sub_1, 4.76837158203125e-07)  # [4096, 1024] -> local [2048, 512] (S(0), S(1)); 4.76837158203125e-07 = 2/4194304, 4194304 = the elements of [4096, 1024]
    del sub_1
    mul__r3 = rt.all_gather(mul, 'tp', dim=1)  # r3 backward: (S(0), S(1)) -> (S(0), R), 8.4 MB, 12.3 us
    del mul
    mul_1 = aten.mul.Tensor(mul__r3, ones_like_default)  # [4096, 1024] -> local [2048, 1024] (S(0), R)
    del ones_like_default, mul__r3
    # fc2
    fc2_mm = aten.mm.default(mul_1, fc2_weight)  # [4096, 4096] -> local [2048, 2048] (S(0), S(1))
    fc2_t_1 = aten.t.default(mul_1)  # [1024, 4096] -> local [1024, 2048] (S(1), R)
    grad_fc2_weight = aten.mm.default(fc2_t_1, gelu)  # [1024, 4096] -> local [1024, 2048] (P, S(1))
    del gelu, fc2_t_1
    if sync:
        grad_fc2_weight = accumulate(grad_fc2_weight, unsynced, 'fc2.weight')
        grad_fc2_weight__r6_pending = rt.start_all_reduce(grad_fc2_weight, 'dp')  # r6 backward: (P, S(1)) -> (R, S(1)), 8.4 MB, 19.9 us, overlaps the rest of backward
        del grad_fc2_weight
    fc2_sum = aten.sum.dim_IntList(mul_1, [0], True)  # [1, 1024] -> local [1, 1024] (P, R)
    del mul_1
    grad_fc2_bias = aten.reshape.default(fc2_sum, [1024])  # [1024] -> local [1024] (P, R)
    del fc2_sum
    if sync:
        grad_fc2_bias = accumulate(grad_fc2_bias, unsynced, 'fc2.bias')
        grad_fc2_bias__r5_pending = rt.start_all_reduce(grad_fc2_bias, 'dp')  # r5 backward: (P, R) -> (R, R), 4.1 KB, 0.0 us, overlaps the rest of backward
        del grad_fc2_bias
    # <model>
    gelu_backward = aten.gelu_backward.default(fc2_mm, fc1_addmm)  # [4096, 4096] -> local [2048, 2048] (S(0), S(1))
    del fc1_addmm, fc2_mm
    # fc1
    fc1_t_1 = aten.t.default(gelu_backward)  # [4096, 4096] -> local [2048, 2048] (S(1), S(0))
    grad_fc1_weight = aten.mm.default(fc1_t_1, x)  # [4096, 1024] -> local [2048, 1024] (P, S(0))
    del fc1_t_1
    if sync:
        grad_fc1_weight = accumulate(grad_fc1_weight, unsynced, 'fc1.weight')
        grad_fc1_weight__r7_pending = rt.start_all_reduce(grad_fc1_weight, 'dp')  # r7 backward: (P, S(0)) -> (R, S(0)), 8.4 MB, 19.9 us, overlaps the rest of backward
        del grad_fc1_weight
    fc1_sum = aten.sum.dim_IntList(gelu_backward, [0], True)  # [1, 4096] -> local [1, 2048] (P, S(1))
    del gelu_backward
    grad_fc1_bias = aten.reshape.default(fc1_sum, [2048])  # [4096] -> local [2048] (P, S(0))
    del fc1_sum
    if sync:
        grad_fc1_bias = accumulate(grad_fc1_bias, unsynced, 'fc1.bias')
        grad_fc1_bias__r4_pending = rt.start_all_reduce(grad_fc1_bias, 'dp')  # r4 backward: (P, S(0)) -> (R, S(0)), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_fc1_bias
    if not sync:  # model.no_sync(): the local gradients, left for the next synced backward
        return {
            'fc1.weight': grad_fc1_weight,
            'fc1.bias': grad_fc1_bias,
            'fc2.weight': grad_fc2_weight,
            'fc2.bias': grad_fc2_bias,
        }
    grad_fc1_weight__r7 = rt.wait(grad_fc1_weight__r7_pending)  # r7: the gradient sync started above
    del grad_fc1_weight__r7_pending
    grad_fc1_bias__r4 = rt.wait(grad_fc1_bias__r4_pending)  # r4: the gradient sync started above
    del grad_fc1_bias__r4_pending
    grad_fc2_weight__r6 = rt.wait(grad_fc2_weight__r6_pending)  # r6: the gradient sync started above
    del grad_fc2_weight__r6_pending
    grad_fc2_bias__r5 = rt.wait(grad_fc2_bias__r5_pending)  # r5: the gradient sync started above
    del grad_fc2_bias__r5_pending
    return {
        'fc1.weight': grad_fc1_weight__r7,
        'fc1.bias': grad_fc1_bias__r4,
        'fc2.weight': grad_fc2_weight__r6,
        'fc2.bias': grad_fc2_bias__r5,
    }


def accumulate(grad, unsynced, name):
    """``grad`` plus the local gradient of ``name`` that earlier micro-batches left unsynced (no_sync)."""
    earlier = unsynced.pop(name, None)
    return grad if earlier is None else grad + earlier
