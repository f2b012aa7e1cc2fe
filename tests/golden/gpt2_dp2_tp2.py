# autopar: per-rank training step for torch.distributed (generated; do not edit)
# plan 8e70889be121 | graph f9c235857f9b1ca1 | mesh (dp=2, tp=2) | hardware h100-sxm
# predicted step 0.5905 ms = compute 0.4483 ms + communication 0.1421 ms
# parameter layouts (S(d): split along dim d; R: replicated):
#   wte.weight                 [256, 2048]   R on dp, R on tp
#   wpe.weight                 [64, 2048]    R on dp, R on tp
#   blocks.0.ln1.weight        [2048]        R on dp, R on tp
#   blocks.0.ln1.bias          [2048]        R on dp, R on tp
#   blocks.0.attn.q.weight     [2048, 2048]  R on dp, S(0) on tp
#   blocks.0.attn.q.bias       [2048]        R on dp, S(0) on tp
#   blocks.0.attn.k.weight     [2048, 2048]  R on dp, S(0) on tp
#   blocks.0.attn.k.bias       [2048]        R on dp, S(0) on tp
#   blocks.0.attn.v.weight     [2048, 2048]  R on dp, S(0) on tp
#   blocks.0.attn.v.bias       [2048]        R on dp, S(0) on tp
#   blocks.0.attn.proj.weight  [2048, 2048]  R on dp, S(1) on tp
#   blocks.0.attn.proj.bias    [2048]        R on dp, R on tp
#   blocks.0.ln2.weight        [2048]        R on dp, R on tp
#   blocks.0.ln2.bias          [2048]        R on dp, R on tp
#   blocks.0.fc.weight         [8192, 2048]  R on dp, S(0) on tp
#   blocks.0.fc.bias           [8192]        R on dp, S(0) on tp
#   blocks.0.out.weight        [2048, 8192]  R on dp, S(1) on tp
#   blocks.0.out.bias          [2048]        R on dp, R on tp
#   blocks.1.ln1.weight        [2048]        R on dp, R on tp
#   blocks.1.ln1.bias          [2048]        R on dp, R on tp
#   blocks.1.attn.q.weight     [2048, 2048]  R on dp, S(0) on tp
#   blocks.1.attn.q.bias       [2048]        R on dp, S(0) on tp
#   blocks.1.attn.k.weight     [2048, 2048]  R on dp, S(0) on tp
#   blocks.1.attn.k.bias       [2048]        R on dp, S(0) on tp
#   blocks.1.attn.v.weight     [2048, 2048]  R on dp, S(0) on tp
#   blocks.1.attn.v.bias       [2048]        R on dp, S(0) on tp
#   blocks.1.attn.proj.weight  [2048, 2048]  R on dp, S(1) on tp
#   blocks.1.attn.proj.bias    [2048]        R on dp, R on tp
#   blocks.1.ln2.weight        [2048]        R on dp, R on tp
#   blocks.1.ln2.bias          [2048]        R on dp, R on tp
#   blocks.1.fc.weight         [8192, 2048]  R on dp, S(0) on tp
#   blocks.1.fc.bias           [8192]        R on dp, S(0) on tp
#   blocks.1.out.weight        [2048, 8192]  R on dp, S(1) on tp
#   blocks.1.out.bias          [2048]        R on dp, R on tp
#   ln_f.weight                [2048]        R on dp, R on tp
#   ln_f.bias                  [2048]        R on dp, R on tp
#   head.weight                [256, 2048]   R on dp, R on tp
# passes:
#   shapes: 309 nodes
#   strategies: 309 nodes, 116 free, 1222 strategies, 0 fallbacks
#   cluster_layers: no repeated layers
#   solve_sharding: 116 variables groups, 220 edges, 32917 booleans, optimal, objective 0.5905 ms, gap 0.00%
#   collectives: 56 redistributions, 50 collectives
#   recompute: peak 844.3 MB per device at mm_26__r55_pending
#   predict: step 0.5905 ms (compute 0.4483, communication 0.1421 + 0.2438 hidden), 100% of FLOPs sharded
# forward(rt, parameters..., buffers..., inputs...) -> (loss, saved, values, {buffer name: new value})
# backward(rt, parameters..., buffers..., inputs..., saved, grad_loss, sync, unsynced)
#     -> {parameter name: gradient}
# all on this rank's local shards; saved: the values forward keeps for backward;
# values: the model's other outputs, in their planned layouts.
import torch

from autopar.runtime import kernels  # kernels by what they compute, on any device

aten = torch.ops.aten

PLAN_HASH = '8e70889be121'
GRAPH_FINGERPRINT = 'f9c235857f9b1ca1'
PLACEHOLDERS = [
    'wte_weight', 'wpe_weight', 'blocks_0_ln1_weight', 'blocks_0_ln1_bias', 'blocks_0_attn_q_weight',
    'blocks_0_attn_q_bias', 'blocks_0_attn_k_weight', 'blocks_0_attn_k_bias', 'blocks_0_attn_v_weight',
    'blocks_0_attn_v_bias', 'blocks_0_attn_proj_weight', 'blocks_0_attn_proj_bias', 'blocks_0_ln2_weight',
    'blocks_0_ln2_bias', 'blocks_0_fc_weight', 'blocks_0_fc_bias', 'blocks_0_out_weight', 'blocks_0_out_bias',
    'blocks_1_ln1_weight', 'blocks_1_ln1_bias', 'blocks_1_attn_q_weight', 'blocks_1_attn_q_bias',
    'blocks_1_attn_k_weight', 'blocks_1_attn_k_bias', 'blocks_1_attn_v_weight', 'blocks_1_attn_v_bias',
    'blocks_1_attn_proj_weight', 'blocks_1_attn_proj_bias', 'blocks_1_ln2_weight', 'blocks_1_ln2_bias',
    'blocks_1_fc_weight', 'blocks_1_fc_bias', 'blocks_1_out_weight', 'blocks_1_out_bias', 'ln_f_weight', 'ln_f_bias',
    'head_weight', 'idx', 'targets',
]


def forward(
    rt, wte_weight, wpe_weight, blocks_0_ln1_weight, blocks_0_ln1_bias, blocks_0_attn_q_weight, blocks_0_attn_q_bias,
    blocks_0_attn_k_weight, blocks_0_attn_k_bias, blocks_0_attn_v_weight, blocks_0_attn_v_bias,
    blocks_0_attn_proj_weight, blocks_0_attn_proj_bias, blocks_0_ln2_weight, blocks_0_ln2_bias, blocks_0_fc_weight,
    blocks_0_fc_bias, blocks_0_out_weight, blocks_0_out_bias, blocks_1_ln1_weight, blocks_1_ln1_bias,
    blocks_1_attn_q_weight, blocks_1_attn_q_bias, blocks_1_attn_k_weight, blocks_1_attn_k_bias, blocks_1_attn_v_weight,
    blocks_1_attn_v_bias, blocks_1_attn_proj_weight, blocks_1_attn_proj_bias, blocks_1_ln2_weight, blocks_1_ln2_bias,
    blocks_1_fc_weight, blocks_1_fc_bias, blocks_1_out_weight, blocks_1_out_bias, ln_f_weight, ln_f_bias, head_weight,
    idx, targets,
):
    # wte_weight (parameter wte.weight): [256, 2048] -> local [256, 2048] (R, R)
    # wpe_weight (parameter wpe.weight): [64, 2048] -> local [64, 2048] (R, R)
    # blocks_0_ln1_weight (parameter blocks.0.ln1.weight): [2048] -> local [2048] (R, R)
    # blocks_0_ln1_bias (parameter blocks.0.ln1.bias): [2048] -> local [2048] (R, R)
    # blocks_0_attn_q_weight (parameter blocks.0.attn.q.weight): [2048, 2048] -> local [1024, 2048] (R, S(0))
    # blocks_0_attn_q_bias (parameter blocks.0.attn.q.bias): [2048] -> local [1024] (R, S(0))
    # blocks_0_attn_k_weight (parameter blocks.0.attn.k.weight): [2048, 2048] -> local [1024, 2048] (R, S(0))
    # blocks_0_attn_k_bias (parameter blocks.0.attn.k.bias): [2048] -> local [1024] (R, S(0))
    # blocks_0_attn_v_weight (parameter blocks.0.attn.v.weight): [2048, 2048] -> local [1024, 2048] (R, S(0))
    # blocks_0_attn_v_bias (parameter blocks.0.attn.v.bias): [2048] -> local [1024] (R, S(0))
    # blocks_0_attn_proj_weight (parameter blocks.0.attn.proj.weight): [2048, 2048] -> local [2048, 1024] (R, S(1))
    # blocks_0_attn_proj_bias (parameter blocks.0.attn.proj.bias): [2048] -> local [2048] (R, R)
    # blocks_0_ln2_weight (parameter blocks.0.ln2.weight): [2048] -> local [2048] (R, R)
    # blocks_0_ln2_bias (parameter blocks.0.ln2.bias): [2048] -> local [2048] (R, R)
    # blocks_0_fc_weight (parameter blocks.0.fc.weight): [8192, 2048] -> local [4096, 2048] (R, S(0))
    # blocks_0_fc_bias (parameter blocks.0.fc.bias): [8192] -> local [4096] (R, S(0))
    # blocks_0_out_weight (parameter blocks.0.out.weight): [2048, 8192] -> local [2048, 4096] (R, S(1))
    # blocks_0_out_bias (parameter blocks.0.out.bias): [2048] -> local [2048] (R, R)
    # blocks_1_ln1_weight (parameter blocks.1.ln1.weight): [2048] -> local [2048] (R, R)
    # blocks_1_ln1_bias (parameter blocks.1.ln1.bias): [2048] -> local [2048] (R, R)
    # blocks_1_attn_q_weight (parameter blocks.1.attn.q.weight): [2048, 2048] -> local [1024, 2048] (R, S(0))
    # blocks_1_attn_q_bias (parameter blocks.1.attn.q.bias): [2048] -> local [1024] (R, S(0))
    # blocks_1_attn_k_weight (parameter blocks.1.attn.k.weight): [2048, 2048] -> local [1024, 2048] (R, S(0))
    # blocks_1_attn_k_bias (parameter blocks.1.attn.k.bias): [2048] -> local [1024] (R, S(0))
    # blocks_1_attn_v_weight (parameter blocks.1.attn.v.weight): [2048, 2048] -> local [1024, 2048] (R, S(0))
    # blocks_1_attn_v_bias (parameter blocks.1.attn.v.bias): [2048] -> local [1024] (R, S(0))
    # blocks_1_attn_proj_weight (parameter blocks.1.attn.proj.weight): [2048, 2048] -> local [2048, 1024] (R, S(1))
    # blocks_1_attn_proj_bias (parameter blocks.1.attn.proj.bias): [2048] -> local [2048] (R, R)
    # blocks_1_ln2_weight (parameter blocks.1.ln2.weight): [2048] -> local [2048] (R, R)
    # blocks_1_ln2_bias (parameter blocks.1.ln2.bias): [2048] -> local [2048] (R, R)
    # blocks_1_fc_weight (parameter blocks.1.fc.weight): [8192, 2048] -> local [4096, 2048] (R, S(0))
    # blocks_1_fc_bias (parameter blocks.1.fc.bias): [8192] -> local [4096] (R, S(0))
    # blocks_1_out_weight (parameter blocks.1.out.weight): [2048, 8192] -> local [2048, 4096] (R, S(1))
    # blocks_1_out_bias (parameter blocks.1.out.bias): [2048] -> local [2048] (R, R)
    # ln_f_weight (parameter ln_f.weight): [2048] -> local [2048] (R, R)
    # ln_f_bias (parameter ln_f.bias): [2048] -> local [2048] (R, R)
    # head_weight (parameter head.weight): [256, 2048] -> local [256, 2048] (R, R)
    # idx (input): [8, 64] -> local [4, 64] (S(0), R)
    # targets (input): [8, 64] -> local [8, 64] (R, R)

    # ---- forward ----
    # <model>
    arange = aten.arange.default(64, device=rt.device, pin_memory=False)  # [64] -> local [64] (R, R)
    # wte
    wte_embedding = aten.embedding.default(wte_weight, idx)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    # wpe
    wpe_embedding = aten.embedding.default(wpe_weight, arange)  # [64, 2048] -> local [64, 2048] (R, R)
    # <model>
    add = aten.add.Tensor(wte_embedding, wpe_embedding)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    del wte_embedding, wpe_embedding
    # blocks.0.ln1
    blocks_0_ln1_native_layer_norm = aten.native_layer_norm.default(add, [2048], blocks_0_ln1_weight, blocks_0_ln1_bias, 1e-05)  # -> (S(0), R), (S(0), R), (S(0), R)
    blocks_0_ln1_getitem = blocks_0_ln1_native_layer_norm[0]  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    blocks_0_ln1_getitem_1 = blocks_0_ln1_native_layer_norm[1]  # [8, 64, 1] -> local [4, 64, 1] (S(0), R)
    blocks_0_ln1_getitem_2 = blocks_0_ln1_native_layer_norm[2]  # [8, 64, 1] -> local [4, 64, 1] (S(0), R)
    del blocks_0_ln1_native_layer_norm
    # blocks.0.attn.q
    blocks_0_attn_q_view = aten.reshape.default(blocks_0_ln1_getitem, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    blocks_0_attn_q_t = aten.t.default(blocks_0_attn_q_weight)  # [2048, 2048] -> local [2048, 1024] (R, S(1))
    blocks_0_attn_q_addmm = aten.addmm.default(blocks_0_attn_q_bias, blocks_0_attn_q_view, blocks_0_attn_q_t)  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_0_attn_q_t
    blocks_0_attn_q_view_1 = aten.reshape.default(blocks_0_attn_q_addmm, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_0_attn_q_addmm
    # blocks.0.attn
    blocks_0_attn_view = aten.reshape.default(blocks_0_attn_q_view_1, [4, 64, 16, 64])  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_0_attn_q_view_1
    blocks_0_attn_transpose = aten.transpose.int(blocks_0_attn_view, 1, 2)  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    del blocks_0_attn_view
    # blocks.0.attn.k
    blocks_0_attn_k_view = aten.reshape.default(blocks_0_ln1_getitem, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    blocks_0_attn_k_t = aten.t.default(blocks_0_attn_k_weight)  # [2048, 2048] -> local [2048, 1024] (R, S(1))
    blocks_0_attn_k_addmm = aten.addmm.default(blocks_0_attn_k_bias, blocks_0_attn_k_view, blocks_0_attn_k_t)  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_0_attn_k_t
    blocks_0_attn_k_view_1 = aten.reshape.default(blocks_0_attn_k_addmm, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_0_attn_k_addmm
    # blocks.0.attn
    blocks_0_attn_view_1 = aten.reshape.default(blocks_0_attn_k_view_1, [4, 64, 16, 64])  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_0_attn_k_view_1
    blocks_0_attn_transpose_1 = aten.transpose.int(blocks_0_attn_view_1, 1, 2)  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    del blocks_0_attn_view_1
    # blocks.0.attn.v
    blocks_0_attn_v_view = aten.reshape.default(blocks_0_ln1_getitem, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    del blocks_0_ln1_getitem
    blocks_0_attn_v_t = aten.t.default(blocks_0_attn_v_weight)  # [2048, 2048] -> local [2048, 1024] (R, S(1))
    blocks_0_attn_v_addmm = aten.addmm.default(blocks_0_attn_v_bias, blocks_0_attn_v_view, blocks_0_attn_v_t)  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_0_attn_v_t
    blocks_0_attn_v_view_1 = aten.reshape.default(blocks_0_attn_v_addmm, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_0_attn_v_addmm
    # blocks.0.attn
    blocks_0_attn_view_2 = aten.reshape.default(blocks_0_attn_v_view_1, [4, 64, 16, 64])  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_0_attn_v_view_1
    blocks_0_attn_transpose_2 = aten.transpose.int(blocks_0_attn_view_2, 1, 2)  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    del blocks_0_attn_view_2
    attention = kernels.attention_forward(blocks_0_attn_transpose, blocks_0_attn_transpose_1, blocks_0_attn_transpose_2, 0.0, True)  # -> (S(0), S(1)), (S(0), S(1))
    blocks_0_attn_getitem = attention[0]  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    blocks_0_attn_getitem_1 = attention[1]  # [8, 32, 64] -> local [4, 16, 64] (S(0), S(1))
    del attention
    blocks_0_attn_detach = aten.detach.default(blocks_0_attn_getitem)  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    blocks_0_attn_transpose_3 = aten.transpose.int(blocks_0_attn_getitem, 1, 2)  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_0_attn_getitem
    blocks_0_attn_view_3 = aten.reshape.default(blocks_0_attn_transpose_3, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_0_attn_transpose_3
    # blocks.0.attn.proj
    blocks_0_attn_proj_view = aten.reshape.default(blocks_0_attn_view_3, [256, 1024])  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_0_attn_view_3
    blocks_0_attn_proj_t = aten.t.default(blocks_0_attn_proj_weight)  # [2048, 2048] -> local [1024, 2048] (R, S(0))
    blocks_0_attn_proj_bias__r0 = rt.zero_partial(blocks_0_attn_proj_bias, 'tp')  # r0 forward: (R, R) -> (R, P), 0 B, 0.0 us
    blocks_0_attn_proj_addmm = aten.addmm.default(blocks_0_attn_proj_bias__r0, blocks_0_attn_proj_view, blocks_0_attn_proj_t)  # [512, 2048] -> local [256, 2048] (S(0), P)
    del blocks_0_attn_proj_t, blocks_0_attn_proj_bias__r0
    blocks_0_attn_proj_view_1 = aten.reshape.default(blocks_0_attn_proj_addmm, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_0_attn_proj_addmm
    blocks_0_attn_proj_view_1__r1 = rt.all_reduce(blocks_0_attn_proj_view_1, 'tp', last_read=True)  # r1 forward: (S(0), P) -> (S(0), R), 2.1 MB, 8.7 us
    del blocks_0_attn_proj_view_1
    # blocks.0
    blocks_0_add = aten.add.Tensor(add, blocks_0_attn_proj_view_1__r1)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    del blocks_0_attn_proj_view_1__r1
    # blocks.0.ln2
    blocks_0_ln2_native_layer_norm = aten.native_layer_norm.default(blocks_0_add, [2048], blocks_0_ln2_weight, blocks_0_ln2_bias, 1e-05)  # -> (S(0), R), (S(0), R), (S(0), R)
    blocks_0_ln2_getitem = blocks_0_ln2_native_layer_norm[0]  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    blocks_0_ln2_getitem_1 = blocks_0_ln2_native_layer_norm[1]  # [8, 64, 1] -> local [4, 64, 1] (S(0), R)
    blocks_0_ln2_getitem_2 = blocks_0_ln2_native_layer_norm[2]  # [8, 64, 1] -> local [4, 64, 1] (S(0), R)
    del blocks_0_ln2_native_layer_norm
    # blocks.0.fc
    blocks_0_fc_view = aten.reshape.default(blocks_0_ln2_getitem, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    del blocks_0_ln2_getitem
    blocks_0_fc_t = aten.t.default(blocks_0_fc_weight)  # [2048, 8192] -> local [2048, 4096] (R, S(1))
    blocks_0_fc_addmm = aten.addmm.default(blocks_0_fc_bias, blocks_0_fc_view, blocks_0_fc_t)  # [512, 8192] -> local [256, 4096] (S(0), S(1))
    del blocks_0_fc_t
    blocks_0_fc_view_1 = aten.reshape.default(blocks_0_fc_addmm, [4, 64, 4096])  # [8, 64, 8192] -> local [4, 64, 4096] (S(0), S(2))
    del blocks_0_fc_addmm
    # blocks.0
    blocks_0_gelu = aten.gelu.default(blocks_0_fc_view_1)  # [8, 64, 8192] -> local [4, 64, 4096] (S(0), S(2))
    # blocks.0.out
    blocks_0_out_view = aten.reshape.default(blocks_0_gelu, [256, 4096])  # [512, 8192] -> local [256, 4096] (S(0), S(1))
    del blocks_0_gelu
    blocks_0_out_t = aten.t.default(blocks_0_out_weight)  # [8192, 2048] -> local [4096, 2048] (R, S(0))
    blocks_0_out_bias__r2 = rt.zero_partial(blocks_0_out_bias, 'tp')  # r2 forward: (R, R) -> (R, P), 0 B, 0.0 us
    blocks_0_out_addmm = aten.addmm.default(blocks_0_out_bias__r2, blocks_0_out_view, blocks_0_out_t)  # [512, 2048] -> local [256, 2048] (S(0), P)
    del blocks_0_out_t, blocks_0_out_bias__r2
    blocks_0_out_view_1 = aten.reshape.default(blocks_0_out_addmm, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_0_out_addmm
    # blocks.0
    blocks_0_clone = aten.clone.default(blocks_0_out_view_1)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_0_out_view_1
    blocks_0_clone__r3 = rt.all_reduce(blocks_0_clone, 'tp', last_read=True)  # r3 forward: (S(0), P) -> (S(0), R), 2.1 MB, 8.7 us
    del blocks_0_clone
    blocks_0_add_1 = aten.add.Tensor(blocks_0_add, blocks_0_clone__r3)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    del blocks_0_clone__r3
    # blocks.1.ln1
    blocks_1_ln1_native_layer_norm = aten.native_layer_norm.default(blocks_0_add_1, [2048], blocks_1_ln1_weight, blocks_1_ln1_bias, 1e-05)  # -> (S(0), R), (S(0), R), (S(0), R)
    blocks_1_ln1_getitem = blocks_1_ln1_native_layer_norm[0]  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    blocks_1_ln1_getitem_1 = blocks_1_ln1_native_layer_norm[1]  # [8, 64, 1] -> local [4, 64, 1] (S(0), R)
    blocks_1_ln1_getitem_2 = blocks_1_ln1_native_layer_norm[2]  # [8, 64, 1] -> local [4, 64, 1] (S(0), R)
    del blocks_1_ln1_native_layer_norm
    # blocks.1.attn.q
    blocks_1_attn_q_view = aten.reshape.default(blocks_1_ln1_getitem, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    blocks_1_attn_q_t = aten.t.default(blocks_1_attn_q_weight)  # [2048, 2048] -> local [2048, 1024] (R, S(1))
    blocks_1_attn_q_addmm = aten.addmm.default(blocks_1_attn_q_bias, blocks_1_attn_q_view, blocks_1_attn_q_t)  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_1_attn_q_t
    blocks_1_attn_q_view_1 = aten.reshape.default(blocks_1_attn_q_addmm, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_1_attn_q_addmm
    # blocks.1.attn
    blocks_1_attn_view = aten.reshape.default(blocks_1_attn_q_view_1, [4, 64, 16, 64])  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_1_attn_q_view_1
    blocks_1_attn_transpose = aten.transpose.int(blocks_1_attn_view, 1, 2)  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    del blocks_1_attn_view
    # blocks.1.attn.k
    blocks_1_attn_k_view = aten.reshape.default(blocks_1_ln1_getitem, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    blocks_1_attn_k_t = aten.t.default(blocks_1_attn_k_weight)  # [2048, 2048] -> local [2048, 1024] (R, S(1))
    blocks_1_attn_k_addmm = aten.addmm.default(blocks_1_attn_k_bias, blocks_1_attn_k_view, blocks_1_attn_k_t)  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_1_attn_k_t
    blocks_1_attn_k_view_1 = aten.reshape.default(blocks_1_attn_k_addmm, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_1_attn_k_addmm
    # blocks.1.attn
    blocks_1_attn_view_1 = aten.reshape.default(blocks_1_attn_k_view_1, [4, 64, 16, 64])  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_1_attn_k_view_1
    blocks_1_attn_transpose_1 = aten.transpose.int(blocks_1_attn_view_1, 1, 2)  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    del blocks_1_attn_view_1
    # blocks.1.attn.v
    blocks_1_attn_v_view = aten.reshape.default(blocks_1_ln1_getitem, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    del blocks_1_ln1_getitem
    blocks_1_attn_v_t = aten.t.default(blocks_1_attn_v_weight)  # [2048, 2048] -> local [2048, 1024] (R, S(1))
    blocks_1_attn_v_addmm = aten.addmm.default(blocks_1_attn_v_bias, blocks_1_attn_v_view, blocks_1_attn_v_t)  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_1_attn_v_t
    blocks_1_attn_v_view_1 = aten.reshape.default(blocks_1_attn_v_addmm, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_1_attn_v_addmm
    # blocks.1.attn
    blocks_1_attn_view_2 = aten.reshape.default(blocks_1_attn_v_view_1, [4, 64, 16, 64])  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_1_attn_v_view_1
    blocks_1_attn_transpose_2 = aten.transpose.int(blocks_1_attn_view_2, 1, 2)  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    del blocks_1_attn_view_2
    attention_1 = kernels.attention_forward(blocks_1_attn_transpose, blocks_1_attn_transpose_1, blocks_1_attn_transpose_2, 0.0, True)  # -> (S(0), S(1)), (S(0), S(1))
    blocks_1_attn_getitem = attention_1[0]  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    blocks_1_attn_getitem_1 = attention_1[1]  # [8, 32, 64] -> local [4, 16, 64] (S(0), S(1))
    del attention_1
    blocks_1_attn_detach = aten.detach.default(blocks_1_attn_getitem)  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    blocks_1_attn_transpose_3 = aten.transpose.int(blocks_1_attn_getitem, 1, 2)  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_1_attn_getitem
    blocks_1_attn_view_3 = aten.reshape.default(blocks_1_attn_transpose_3, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_1_attn_transpose_3
    # blocks.1.attn.proj
    blocks_1_attn_proj_view = aten.reshape.default(blocks_1_attn_view_3, [256, 1024])  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_1_attn_view_3
    blocks_1_attn_proj_t = aten.t.default(blocks_1_attn_proj_weight)  # [2048, 2048] -> local [1024, 2048] (R, S(0))
    blocks_1_attn_proj_bias__r4 = rt.zero_partial(blocks_1_attn_proj_bias, 'tp')  # r4 forward: (R, R) -> (R, P), 0 B, 0.0 us
    blocks_1_attn_proj_addmm = aten.addmm.default(blocks_1_attn_proj_bias__r4, blocks_1_attn_proj_view, blocks_1_attn_proj_t)  # [512, 2048] -> local [256, 2048] (S(0), P)
    del blocks_1_attn_proj_t, blocks_1_attn_proj_bias__r4
    blocks_1_attn_proj_view_1 = aten.reshape.default(blocks_1_attn_proj_addmm, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_1_attn_proj_addmm
    blocks_1_attn_proj_view_1__r5 = rt.all_reduce(blocks_1_attn_proj_view_1, 'tp', last_read=True)  # r5 forward: (S(0), P) -> (S(0), R), 2.1 MB, 8.7 us
    del blocks_1_attn_proj_view_1
    # blocks.1
    blocks_1_add = aten.add.Tensor(blocks_0_add_1, blocks_1_attn_proj_view_1__r5)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    del blocks_1_attn_proj_view_1__r5
    # blocks.1.ln2
    blocks_1_ln2_native_layer_norm = aten.native_layer_norm.default(blocks_1_add, [2048], blocks_1_ln2_weight, blocks_1_ln2_bias, 1e-05)  # -> (S(0), R), (S(0), R), (S(0), R)
    blocks_1_ln2_getitem = blocks_1_ln2_native_layer_norm[0]  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    blocks_1_ln2_getitem_1 = blocks_1_ln2_native_layer_norm[1]  # [8, 64, 1] -> local [4, 64, 1] (S(0), R)
    blocks_1_ln2_getitem_2 = blocks_1_ln2_native_layer_norm[2]  # [8, 64, 1] -> local [4, 64, 1] (S(0), R)
    del blocks_1_ln2_native_layer_norm
    # blocks.1.fc
    blocks_1_fc_view = aten.reshape.default(blocks_1_ln2_getitem, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    del blocks_1_ln2_getitem
    blocks_1_fc_t = aten.t.default(blocks_1_fc_weight)  # [2048, 8192] -> local [2048, 4096] (R, S(1))
    blocks_1_fc_addmm = aten.addmm.default(blocks_1_fc_bias, blocks_1_fc_view, blocks_1_fc_t)  # [512, 8192] -> local [256, 4096] (S(0), S(1))
    del blocks_1_fc_t
    blocks_1_fc_view_1 = aten.reshape.default(blocks_1_fc_addmm, [4, 64, 4096])  # [8, 64, 8192] -> local [4, 64, 4096] (S(0), S(2))
    del blocks_1_fc_addmm
    # blocks.1
    blocks_1_gelu = aten.gelu.default(blocks_1_fc_view_1)  # [8, 64, 8192] -> local [4, 64, 4096] (S(0), S(2))
    # blocks.1.out
    blocks_1_out_view = aten.reshape.default(blocks_1_gelu, [256, 4096])  # [512, 8192] -> local [256, 4096] (S(0), S(1))
    del blocks_1_gelu
    blocks_1_out_t = aten.t.default(blocks_1_out_weight)  # [8192, 2048] -> local [4096, 2048] (R, S(0))
    blocks_1_out_bias__r6 = rt.zero_partial(blocks_1_out_bias, 'tp')  # r6 forward: (R, R) -> (R, P), 0 B, 0.0 us
    blocks_1_out_addmm = aten.addmm.default(blocks_1_out_bias__r6, blocks_1_out_view, blocks_1_out_t)  # [512, 2048] -> local [256, 2048] (S(0), P)
    del blocks_1_out_t, blocks_1_out_bias__r6
    blocks_1_out_view_1 = aten.reshape.default(blocks_1_out_addmm, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_1_out_addmm
    # blocks.1
    blocks_1_clone = aten.clone.default(blocks_1_out_view_1)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_1_out_view_1
    blocks_1_clone__r7 = rt.all_reduce(blocks_1_clone, 'tp', last_read=True)  # r7 forward: (S(0), P) -> (S(0), R), 2.1 MB, 8.7 us
    del blocks_1_clone
    blocks_1_add_1 = aten.add.Tensor(blocks_1_add, blocks_1_clone__r7)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    del blocks_1_clone__r7
    # ln_f
    ln_f_native_layer_norm = aten.native_layer_norm.default(blocks_1_add_1, [2048], ln_f_weight, ln_f_bias, 1e-05)  # -> (S(0), R), (S(0), R), (S(0), R)
    ln_f_getitem = ln_f_native_layer_norm[0]  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    ln_f_getitem_1 = ln_f_native_layer_norm[1]  # [8, 64, 1] -> local [4, 64, 1] (S(0), R)
    ln_f_getitem_2 = ln_f_native_layer_norm[2]  # [8, 64, 1] -> local [4, 64, 1] (S(0), R)
    del ln_f_native_layer_norm
    # head
    head_t = aten.t.default(head_weight)  # [2048, 256] -> local [2048, 256] (R, R)
    head_view = aten.reshape.default(ln_f_getitem, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    del ln_f_getitem
    head_mm = aten.mm.default(head_view, head_t)  # [512, 256] -> local [256, 256] (S(0), R)
    del head_t
    head__unsafe_view = aten.reshape.default(head_mm, [4, 64, 256])  # [8, 64, 256] -> local [4, 64, 256] (S(0), R)
    del head_mm
    # <model>
    view_33 = aten.reshape.default(head__unsafe_view, [256, 256])  # [512, 256] -> local [256, 256] (S(0), R)
    del head__unsafe_view
    view_34 = aten.reshape.default(targets, [512])  # [512] -> local [512] (R, R)
    _log_softmax = aten._log_softmax.default(view_33, 1, False)  # [512, 256] -> local [256, 256] (S(0), R)
    del view_33
    detach_2 = aten.detach.default(_log_softmax)  # [512, 256] -> local [256, 256] (S(0), R)
    _log_softmax__r8 = rt.all_gather(_log_softmax, 'dp', dim=0)  # r8 forward: (S(0), R) -> (R, R), 524.3 KB, 3.6 us
    nll_loss_forward_default = aten.nll_loss_forward.default(_log_softmax__r8, view_34, None, 2, -100)  # -> (R, R), (R, R)
    del _log_softmax__r8
    getitem_42 = nll_loss_forward_default[0]  # [] -> local [] (R, R)
    getitem_43 = nll_loss_forward_default[1]  # [] -> local [] (R, R)
    del nll_loss_forward_default
    div_tensor = aten.div.Tensor(getitem_42, getitem_43)  # [] -> local [] (R, R)
    del getitem_42
    return (
        div_tensor,
        [
            arange, add, blocks_0_ln1_getitem_1, blocks_0_ln1_getitem_2, blocks_0_attn_q_view, blocks_0_attn_transpose,
            blocks_0_attn_k_view, blocks_0_attn_transpose_1, blocks_0_attn_v_view, blocks_0_attn_transpose_2,
            blocks_0_attn_getitem_1, blocks_0_attn_detach, blocks_0_attn_proj_view, blocks_0_add, blocks_0_ln2_getitem_1,
            blocks_0_ln2_getitem_2, blocks_0_fc_view, blocks_0_fc_view_1, blocks_0_out_view, blocks_0_add_1,
            blocks_1_ln1_getitem_1, blocks_1_ln1_getitem_2, blocks_1_attn_q_view, blocks_1_attn_transpose, blocks_1_attn_k_view,
            blocks_1_attn_transpose_1, blocks_1_attn_v_view, blocks_1_attn_transpose_2, blocks_1_attn_getitem_1,
            blocks_1_attn_detach, blocks_1_attn_proj_view, blocks_1_add, blocks_1_ln2_getitem_1, blocks_1_ln2_getitem_2,
            blocks_1_fc_view, blocks_1_fc_view_1, blocks_1_out_view, blocks_1_add_1, ln_f_getitem_1, ln_f_getitem_2, head_view,
            view_34, _log_softmax, detach_2, getitem_43, div_tensor,
        ],  # saved for backward
        [],  # the model's other outputs
        {},  # the buffers' new values
    )


def backward(
    rt, wte_weight, wpe_weight, blocks_0_ln1_weight, blocks_0_ln1_bias, blocks_0_attn_q_weight, blocks_0_attn_q_bias,
    blocks_0_attn_k_weight, blocks_0_attn_k_bias, blocks_0_attn_v_weight, blocks_0_attn_v_bias,
    blocks_0_attn_proj_weight, blocks_0_attn_proj_bias, blocks_0_ln2_weight, blocks_0_ln2_bias, blocks_0_fc_weight,
    blocks_0_fc_bias, blocks_0_out_weight, blocks_0_out_bias, blocks_1_ln1_weight, blocks_1_ln1_bias,
    blocks_1_attn_q_weight, blocks_1_attn_q_bias, blocks_1_attn_k_weight, blocks_1_attn_k_bias, blocks_1_attn_v_weight,
    blocks_1_attn_v_bias, blocks_1_attn_proj_weight, blocks_1_attn_proj_bias, blocks_1_ln2_weight, blocks_1_ln2_bias,
    blocks_1_fc_weight, blocks_1_fc_bias, blocks_1_out_weight, blocks_1_out_bias, ln_f_weight, ln_f_bias, head_weight,
    idx, targets, saved, grad_loss, sync, unsynced,
):
    [
        arange, add, blocks_0_ln1_getitem_1, blocks_0_ln1_getitem_2, blocks_0_attn_q_view, blocks_0_attn_transpose,
        blocks_0_attn_k_view, blocks_0_attn_transpose_1, blocks_0_attn_v_view, blocks_0_attn_transpose_2,
        blocks_0_attn_getitem_1, blocks_0_attn_detach, blocks_0_attn_proj_view, blocks_0_add, blocks_0_ln2_getitem_1,
        blocks_0_ln2_getitem_2, blocks_0_fc_view, blocks_0_fc_view_1, blocks_0_out_view, blocks_0_add_1,
        blocks_1_ln1_getitem_1, blocks_1_ln1_getitem_2, blocks_1_attn_q_view, blocks_1_attn_transpose, blocks_1_attn_k_view,
        blocks_1_attn_transpose_1, blocks_1_attn_v_view, blocks_1_attn_transpose_2, blocks_1_attn_getitem_1,
        blocks_1_attn_detach, blocks_1_attn_proj_view, blocks_1_add, blocks_1_ln2_getitem_1, blocks_1_ln2_getitem_2,
        blocks_1_fc_view, blocks_1_fc_view_1, blocks_1_out_view, blocks_1_add_1, ln_f_getitem_1, ln_f_getitem_2, head_view,
        view_34, _log_softmax, detach_2, getitem_43, div_tensor,
    ] = saved  # the values forward kept for backward
    saved.clear()  # held here alone now: each is freed after its last use

    # ---- backward ----
    # <model>
    ones_like_default = grad_loss  # d(loss)/d(loss): what autograd hands backward (1 for loss.backward())
    del div_tensor
    view_34__r9 = rt.shard(view_34, 'dp', dim=0)  # r9 backward: (R, R) -> (S(0), R), 0 B, 0.0 us
    del view_34
    nll_loss_backward = aten.nll_loss_backward.default(ones_like_default, _log_softmax, view_34__r9, None, 1, -100, getitem_43)  # [512, 256] -> local [256, 256] (S(0), R)
    del _log_softmax, getitem_43, ones_like_default, view_34__r9
    detach_3 = aten.detach.default(detach_2)  # [512, 256] -> local [256, 256] (S(0), R)
    del detach_2
    _log_softmax_backward_data = aten._log_softmax_backward_data.default(nll_loss_backward, detach_3, 1, torch.float32)  # [512, 256] -> local [256, 256] (S(0), R)
    del nll_loss_backward, detach_3
    view_35 = aten.reshape.default(_log_softmax_backward_data, [4, 64, 256])  # [8, 64, 256] -> local [4, 64, 256] (S(0), R)
    del _log_softmax_backward_data
    # head
    head_view_1 = aten.reshape.default(view_35, [256, 256])  # [512, 256] -> local [256, 256] (S(0), R)
    del view_35
    head_t_1 = aten.t.default(head_view_1)  # [256, 512] -> local [256, 256] (S(1), R)
    grad_head_weight = aten.mm.default(head_t_1, head_view)  # [256, 2048] -> local [256, 2048] (P, R)
    del head_view, head_t_1
    if sync:
        grad_head_weight = accumulate(grad_head_weight, unsynced, 'head.weight')
        grad_head_weight__r46_pending = rt.start_all_reduce(grad_head_weight, 'dp')  # r46 backward: (P, R) -> (R, R), 2.1 MB, 5.0 us, overlaps the rest of backward
        del grad_head_weight
    head_mm_1 = aten.mm.default(head_view_1, head_weight)  # [512, 2048] -> local [256, 2048] (S(0), R)
    del head_view_1
    head_view_2 = aten.reshape.default(head_mm_1, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    del head_mm_1
    # ln_f
    ln_f_native_layer_norm_backward = aten.native_layer_norm_backward.default(head_view_2, blocks_1_add_1, [2048], ln_f_getitem_1, ln_f_getitem_2, ln_f_weight, ln_f_bias, [True, True, True])  # -> (S(0), R), (P, R), (P, R)
    del blocks_1_add_1, ln_f_getitem_1, ln_f_getitem_2, head_view_2
    ln_f_getitem_3 = ln_f_native_layer_norm_backward[0]  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    grad_ln_f_weight = ln_f_native_layer_norm_backward[1]  # [2048] -> local [2048] (P, R)
    if sync:
        grad_ln_f_weight = accumulate(grad_ln_f_weight, unsynced, 'ln_f.weight')
        grad_ln_f_weight__r44_pending = rt.start_all_reduce(grad_ln_f_weight, 'dp')  # r44 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_ln_f_weight
    grad_ln_f_bias = ln_f_native_layer_norm_backward[2]  # [2048] -> local [2048] (P, R)
    del ln_f_native_layer_norm_backward
    if sync:
        grad_ln_f_bias = accumulate(grad_ln_f_bias, unsynced, 'ln_f.bias')
        grad_ln_f_bias__r45_pending = rt.start_all_reduce(grad_ln_f_bias, 'dp')  # r45 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_ln_f_bias
    # blocks.1.out
    blocks_1_out_view_2 = aten.reshape.default(ln_f_getitem_3, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    blocks_1_out_mm = aten.mm.default(blocks_1_out_view_2, blocks_1_out_weight)  # [512, 8192] -> local [256, 4096] (S(0), S(1))
    blocks_1_out_t_1 = aten.t.default(blocks_1_out_view_2)  # [2048, 512] -> local [2048, 256] (S(1), R)
    blocks_1_out_t_1__r10 = rt.all_gather(blocks_1_out_t_1, 'dp', dim=1)  # r10 backward: (S(1), R) -> (R, R), 4.2 MB, 7.7 us
    del blocks_1_out_t_1
    blocks_1_out_view__r11 = rt.all_gather(blocks_1_out_view, 'dp', dim=0)  # r11 backward: (S(0), S(1)) -> (R, S(1)), 8.4 MB, 12.3 us
    del blocks_1_out_view
    grad_blocks_1_out_weight = aten.mm.default(blocks_1_out_t_1__r10, blocks_1_out_view__r11)  # [2048, 8192] -> local [2048, 4096] (R, S(1))
    del blocks_1_out_t_1__r10, blocks_1_out_view__r11
    blocks_1_out_sum = aten.sum.dim_IntList(blocks_1_out_view_2, [0], True)  # [1, 2048] -> local [1, 2048] (P, R)
    del blocks_1_out_view_2
    grad_blocks_1_out_bias = aten.reshape.default(blocks_1_out_sum, [2048])  # [2048] -> local [2048] (P, R)
    del blocks_1_out_sum
    if sync:
        grad_blocks_1_out_bias = accumulate(grad_blocks_1_out_bias, unsynced, 'blocks.1.out.bias')
        grad_blocks_1_out_bias__r43_pending = rt.start_all_reduce(grad_blocks_1_out_bias, 'dp')  # r43 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_1_out_bias
    blocks_1_out_view_3 = aten.reshape.default(blocks_1_out_mm, [4, 64, 4096])  # [8, 64, 8192] -> local [4, 64, 4096] (S(0), S(2))
    del blocks_1_out_mm
    # blocks.1
    blocks_1_gelu_backward = aten.gelu_backward.default(blocks_1_out_view_3, blocks_1_fc_view_1)  # [8, 64, 8192] -> local [4, 64, 4096] (S(0), S(2))
    del blocks_1_fc_view_1, blocks_1_out_view_3
    # blocks.1.fc
    blocks_1_fc_view_2 = aten.reshape.default(blocks_1_gelu_backward, [256, 4096])  # [512, 8192] -> local [256, 4096] (S(0), S(1))
    del blocks_1_gelu_backward
    blocks_1_fc_mm = aten.mm.default(blocks_1_fc_view_2, blocks_1_fc_weight)  # [512, 2048] -> local [256, 2048] (S(0), P)
    blocks_1_fc_t_1 = aten.t.default(blocks_1_fc_view_2)  # [8192, 512] -> local [4096, 256] (S(1), S(0))
    blocks_1_fc_t_1__r12 = rt.all_gather(blocks_1_fc_t_1, 'dp', dim=1)  # r12 backward: (S(1), S(0)) -> (R, S(0)), 8.4 MB, 12.3 us
    del blocks_1_fc_t_1
    blocks_1_fc_view__r13 = rt.all_gather(blocks_1_fc_view, 'dp', dim=0)  # r13 backward: (S(0), R) -> (R, R), 4.2 MB, 7.7 us
    del blocks_1_fc_view
    grad_blocks_1_fc_weight = aten.mm.default(blocks_1_fc_t_1__r12, blocks_1_fc_view__r13)  # [8192, 2048] -> local [4096, 2048] (R, S(0))
    del blocks_1_fc_t_1__r12, blocks_1_fc_view__r13
    blocks_1_fc_sum = aten.sum.dim_IntList(blocks_1_fc_view_2, [0], True)  # [1, 8192] -> local [1, 4096] (P, S(1))
    del blocks_1_fc_view_2
    grad_blocks_1_fc_bias = aten.reshape.default(blocks_1_fc_sum, [4096])  # [8192] -> local [4096] (P, S(0))
    del blocks_1_fc_sum
    if sync:
        grad_blocks_1_fc_bias = accumulate(grad_blocks_1_fc_bias, unsynced, 'blocks.1.fc.bias')
        grad_blocks_1_fc_bias__r42_pending = rt.start_all_reduce(grad_blocks_1_fc_bias, 'dp')  # r42 backward: (P, S(0)) -> (R, S(0)), 16.4 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_1_fc_bias
    blocks_1_fc_view_3 = aten.reshape.default(blocks_1_fc_mm, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_1_fc_mm
    blocks_1_fc_view_3__r14 = rt.all_reduce(blocks_1_fc_view_3, 'tp', last_read=True)  # r14 backward: (S(0), P) -> (S(0), R), 2.1 MB, 8.7 us
    del blocks_1_fc_view_3
    # blocks.1.ln2
    blocks_1_ln2_native_layer_norm_backward = aten.native_layer_norm_backward.default(blocks_1_fc_view_3__r14, blocks_1_add, [2048], blocks_1_ln2_getitem_1, blocks_1_ln2_getitem_2, blocks_1_ln2_weight, blocks_1_ln2_bias, [True, True, True])  # -> (S(0), R), (P, R), (P, R)
    del blocks_1_add, blocks_1_ln2_getitem_1, blocks_1_ln2_getitem_2, blocks_1_fc_view_3__r14
    blocks_1_ln2_getitem_3 = blocks_1_ln2_native_layer_norm_backward[0]  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    grad_blocks_1_ln2_weight = blocks_1_ln2_native_layer_norm_backward[1]  # [2048] -> local [2048] (P, R)
    if sync:
        grad_blocks_1_ln2_weight = accumulate(grad_blocks_1_ln2_weight, unsynced, 'blocks.1.ln2.weight')
        grad_blocks_1_ln2_weight__r40_pending = rt.start_all_reduce(grad_blocks_1_ln2_weight, 'dp')  # r40 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_1_ln2_weight
    grad_blocks_1_ln2_bias = blocks_1_ln2_native_layer_norm_backward[2]  # [2048] -> local [2048] (P, R)
    del blocks_1_ln2_native_layer_norm_backward
    if sync:
        grad_blocks_1_ln2_bias = accumulate(grad_blocks_1_ln2_bias, unsynced, 'blocks.1.ln2.bias')
        grad_blocks_1_ln2_bias__r41_pending = rt.start_all_reduce(grad_blocks_1_ln2_bias, 'dp')  # r41 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_1_ln2_bias
    blocks_1_ln2_add = aten.add.Tensor(ln_f_getitem_3, blocks_1_ln2_getitem_3)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    del ln_f_getitem_3, blocks_1_ln2_getitem_3
    # blocks.1.attn.proj
    blocks_1_attn_proj_view_2 = aten.reshape.default(blocks_1_ln2_add, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    blocks_1_attn_proj_mm = aten.mm.default(blocks_1_attn_proj_view_2, blocks_1_attn_proj_weight)  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    blocks_1_attn_proj_t_1 = aten.t.default(blocks_1_attn_proj_view_2)  # [2048, 512] -> local [2048, 256] (S(1), R)
    grad_blocks_1_attn_proj_weight = aten.mm.default(blocks_1_attn_proj_t_1, blocks_1_attn_proj_view)  # [2048, 2048] -> local [2048, 1024] (P, S(1))
    del blocks_1_attn_proj_view, blocks_1_attn_proj_t_1
    if sync:
        grad_blocks_1_attn_proj_weight = accumulate(grad_blocks_1_attn_proj_weight, unsynced, 'blocks.1.attn.proj.weight')
        grad_blocks_1_attn_proj_weight__r47_pending = rt.start_all_reduce(grad_blocks_1_attn_proj_weight, 'dp')  # r47 backward: (P, S(1)) -> (R, S(1)), 8.4 MB, 19.9 us, overlaps the rest of backward
        del grad_blocks_1_attn_proj_weight
    blocks_1_attn_proj_sum = aten.sum.dim_IntList(blocks_1_attn_proj_view_2, [0], True)  # [1, 2048] -> local [1, 2048] (P, R)
    del blocks_1_attn_proj_view_2
    grad_blocks_1_attn_proj_bias = aten.reshape.default(blocks_1_attn_proj_sum, [2048])  # [2048] -> local [2048] (P, R)
    del blocks_1_attn_proj_sum
    if sync:
        grad_blocks_1_attn_proj_bias = accumulate(grad_blocks_1_attn_proj_bias, unsynced, 'blocks.1.attn.proj.bias')
        grad_blocks_1_attn_proj_bias__r39_pending = rt.start_all_reduce(grad_blocks_1_attn_proj_bias, 'dp')  # r39 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_1_attn_proj_bias
    blocks_1_attn_proj_view_3 = aten.reshape.default(blocks_1_attn_proj_mm, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_1_attn_proj_mm
    # blocks.1.attn
    blocks_1_attn_view_4 = aten.reshape.default(blocks_1_attn_proj_view_3, [4, 64, 16, 64])  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_1_attn_proj_view_3
    blocks_1_attn_transpose_4 = aten.transpose.int(blocks_1_attn_view_4, 1, 2)  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    del blocks_1_attn_view_4
    blocks_1_attn_detach_1 = aten.detach.default(blocks_1_attn_detach)  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    del blocks_1_attn_detach
    attention_backward = kernels.attention_backward(blocks_1_attn_transpose_4, blocks_1_attn_transpose, blocks_1_attn_transpose_1, blocks_1_attn_transpose_2, blocks_1_attn_detach_1, blocks_1_attn_getitem_1, 0.0, True)  # -> (S(0), S(1)), (S(0), S(1)), (S(0), S(1))
    del blocks_1_attn_transpose, blocks_1_attn_transpose_1, blocks_1_attn_transpose_2, blocks_1_attn_getitem_1, blocks_1_attn_transpose_4, blocks_1_attn_detach_1
    blocks_1_attn_getitem_2 = attention_backward[0]  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    blocks_1_attn_getitem_3 = attention_backward[1]  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    blocks_1_attn_getitem_4 = attention_backward[2]  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    del attention_backward
    blocks_1_attn_transpose_5 = aten.transpose.int(blocks_1_attn_getitem_4, 1, 2)  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_1_attn_getitem_4
    blocks_1_attn_view_5 = aten.reshape.default(blocks_1_attn_transpose_5, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_1_attn_transpose_5
    # blocks.1.attn.v
    blocks_1_attn_v_view_2 = aten.reshape.default(blocks_1_attn_view_5, [256, 1024])  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_1_attn_view_5
    blocks_1_attn_v_mm = aten.mm.default(blocks_1_attn_v_view_2, blocks_1_attn_v_weight)  # [512, 2048] -> local [256, 2048] (S(0), P)
    blocks_1_attn_v_t_1 = aten.t.default(blocks_1_attn_v_view_2)  # [2048, 512] -> local [1024, 256] (S(1), S(0))
    grad_blocks_1_attn_v_weight = aten.mm.default(blocks_1_attn_v_t_1, blocks_1_attn_v_view)  # [2048, 2048] -> local [1024, 2048] (P, S(0))
    del blocks_1_attn_v_view, blocks_1_attn_v_t_1
    if sync:
        grad_blocks_1_attn_v_weight = accumulate(grad_blocks_1_attn_v_weight, unsynced, 'blocks.1.attn.v.weight')
        grad_blocks_1_attn_v_weight__r48_pending = rt.start_all_reduce(grad_blocks_1_attn_v_weight, 'dp')  # r48 backward: (P, S(0)) -> (R, S(0)), 8.4 MB, 19.9 us, overlaps the rest of backward
        del grad_blocks_1_attn_v_weight
    blocks_1_attn_v_sum = aten.sum.dim_IntList(blocks_1_attn_v_view_2, [0], True)  # [1, 2048] -> local [1, 1024] (P, S(1))
    del blocks_1_attn_v_view_2
    grad_blocks_1_attn_v_bias = aten.reshape.default(blocks_1_attn_v_sum, [1024])  # [2048] -> local [1024] (P, S(0))
    del blocks_1_attn_v_sum
    if sync:
        grad_blocks_1_attn_v_bias = accumulate(grad_blocks_1_attn_v_bias, unsynced, 'blocks.1.attn.v.bias')
        grad_blocks_1_attn_v_bias__r38_pending = rt.start_all_reduce(grad_blocks_1_attn_v_bias, 'dp')  # r38 backward: (P, S(0)) -> (R, S(0)), 4.1 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_1_attn_v_bias
    blocks_1_attn_v_view_3 = aten.reshape.default(blocks_1_attn_v_mm, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_1_attn_v_mm
    # blocks.1.attn
    blocks_1_attn_transpose_6 = aten.transpose.int(blocks_1_attn_getitem_3, 1, 2)  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_1_attn_getitem_3
    blocks_1_attn_view_6 = aten.reshape.default(blocks_1_attn_transpose_6, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_1_attn_transpose_6
    # blocks.1.attn.k
    blocks_1_attn_k_view_2 = aten.reshape.default(blocks_1_attn_view_6, [256, 1024])  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_1_attn_view_6
    blocks_1_attn_k_mm = aten.mm.default(blocks_1_attn_k_view_2, blocks_1_attn_k_weight)  # [512, 2048] -> local [256, 2048] (S(0), P)
    blocks_1_attn_k_t_1 = aten.t.default(blocks_1_attn_k_view_2)  # [2048, 512] -> local [1024, 256] (S(1), S(0))
    grad_blocks_1_attn_k_weight = aten.mm.default(blocks_1_attn_k_t_1, blocks_1_attn_k_view)  # [2048, 2048] -> local [1024, 2048] (P, S(0))
    del blocks_1_attn_k_view, blocks_1_attn_k_t_1
    if sync:
        grad_blocks_1_attn_k_weight = accumulate(grad_blocks_1_attn_k_weight, unsynced, 'blocks.1.attn.k.weight')
        grad_blocks_1_attn_k_weight__r49_pending = rt.start_all_reduce(grad_blocks_1_attn_k_weight, 'dp')  # r49 backward: (P, S(0)) -> (R, S(0)), 8.4 MB, 19.9 us, overlaps the rest of backward
        del grad_blocks_1_attn_k_weight
    blocks_1_attn_k_sum = aten.sum.dim_IntList(blocks_1_attn_k_view_2, [0], True)  # [1, 2048] -> local [1, 1024] (P, S(1))
    del blocks_1_attn_k_view_2
    grad_blocks_1_attn_k_bias = aten.reshape.default(blocks_1_attn_k_sum, [1024])  # [2048] -> local [1024] (P, S(0))
    del blocks_1_attn_k_sum
    if sync:
        grad_blocks_1_attn_k_bias = accumulate(grad_blocks_1_attn_k_bias, unsynced, 'blocks.1.attn.k.bias')
        grad_blocks_1_attn_k_bias__r37_pending = rt.start_all_reduce(grad_blocks_1_attn_k_bias, 'dp')  # r37 backward: (P, S(0)) -> (R, S(0)), 4.1 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_1_attn_k_bias
    blocks_1_attn_k_view_3 = aten.reshape.default(blocks_1_attn_k_mm, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_1_attn_k_mm
    # blocks.1.attn.v
    blocks_1_attn_v_add = aten.add.Tensor(blocks_1_attn_v_view_3, blocks_1_attn_k_view_3)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_1_attn_v_view_3, blocks_1_attn_k_view_3
    # blocks.1.attn
    blocks_1_attn_transpose_7 = aten.transpose.int(blocks_1_attn_getitem_2, 1, 2)  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_1_attn_getitem_2
    blocks_1_attn_view_7 = aten.reshape.default(blocks_1_attn_transpose_7, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_1_attn_transpose_7
    # blocks.1.attn.q
    blocks_1_attn_q_view_2 = aten.reshape.default(blocks_1_attn_view_7, [256, 1024])  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_1_attn_view_7
    blocks_1_attn_q_mm = aten.mm.default(blocks_1_attn_q_view_2, blocks_1_attn_q_weight)  # [512, 2048] -> local [256, 2048] (S(0), P)
    blocks_1_attn_q_t_1 = aten.t.default(blocks_1_attn_q_view_2)  # [2048, 512] -> local [1024, 256] (S(1), S(0))
    grad_blocks_1_attn_q_weight = aten.mm.default(blocks_1_attn_q_t_1, blocks_1_attn_q_view)  # [2048, 2048] -> local [1024, 2048] (P, S(0))
    del blocks_1_attn_q_view, blocks_1_attn_q_t_1
    if sync:
        grad_blocks_1_attn_q_weight = accumulate(grad_blocks_1_attn_q_weight, unsynced, 'blocks.1.attn.q.weight')
        grad_blocks_1_attn_q_weight__r50_pending = rt.start_all_reduce(grad_blocks_1_attn_q_weight, 'dp')  # r50 backward: (P, S(0)) -> (R, S(0)), 8.4 MB, 19.9 us, overlaps the rest of backward
        del grad_blocks_1_attn_q_weight
    blocks_1_attn_q_sum = aten.sum.dim_IntList(blocks_1_attn_q_view_2, [0], True)  # [1, 2048] -> local [1, 1024] (P, S(1))
    del blocks_1_attn_q_view_2
    grad_blocks_1_attn_q_bias = aten.reshape.default(blocks_1_attn_q_sum, [1024])  # [2048] -> local [1024] (P, S(0))
    del blocks_1_attn_q_sum
    if sync:
        grad_blocks_1_attn_q_bias = accumulate(grad_blocks_1_attn_q_bias, unsynced, 'blocks.1.attn.q.bias')
        grad_blocks_1_attn_q_bias__r36_pending = rt.start_all_reduce(grad_blocks_1_attn_q_bias, 'dp')  # r36 backward: (P, S(0)) -> (R, S(0)), 4.1 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_1_attn_q_bias
    blocks_1_attn_q_view_3 = aten.reshape.default(blocks_1_attn_q_mm, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_1_attn_q_mm
    # blocks.1.attn.v
    blocks_1_attn_v_add_1 = aten.add.Tensor(blocks_1_attn_v_add, blocks_1_attn_q_view_3)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_1_attn_v_add, blocks_1_attn_q_view_3
    blocks_1_attn_v_add_1__r15 = rt.all_reduce(blocks_1_attn_v_add_1, 'tp', last_read=True)  # r15 backward: (S(0), P) -> (S(0), R), 2.1 MB, 8.7 us
    del blocks_1_attn_v_add_1
    # blocks.1.ln1
    blocks_1_ln1_native_layer_norm_backward = aten.native_layer_norm_backward.default(blocks_1_attn_v_add_1__r15, blocks_0_add_1, [2048], blocks_1_ln1_getitem_1, blocks_1_ln1_getitem_2, blocks_1_ln1_weight, blocks_1_ln1_bias, [True, True, True])  # -> (S(0), R), (P, R), (P, R)
    del blocks_0_add_1, blocks_1_ln1_getitem_1, blocks_1_ln1_getitem_2, blocks_1_attn_v_add_1__r15
    blocks_1_ln1_getitem_3 = blocks_1_ln1_native_layer_norm_backward[0]  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    grad_blocks_1_ln1_weight = blocks_1_ln1_native_layer_norm_backward[1]  # [2048] -> local [2048] (P, R)
    if sync:
        grad_blocks_1_ln1_weight = accumulate(grad_blocks_1_ln1_weight, unsynced, 'blocks.1.ln1.weight')
        grad_blocks_1_ln1_weight__r34_pending = rt.start_all_reduce(grad_blocks_1_ln1_weight, 'dp')  # r34 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_1_ln1_weight
    grad_blocks_1_ln1_bias = blocks_1_ln1_native_layer_norm_backward[2]  # [2048] -> local [2048] (P, R)
    del blocks_1_ln1_native_layer_norm_backward
    if sync:
        grad_blocks_1_ln1_bias = accumulate(grad_blocks_1_ln1_bias, unsynced, 'blocks.1.ln1.bias')
        grad_blocks_1_ln1_bias__r35_pending = rt.start_all_reduce(grad_blocks_1_ln1_bias, 'dp')  # r35 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_1_ln1_bias
    # blocks.1.ln2
    blocks_1_ln2_add_1 = aten.add.Tensor(blocks_1_ln2_add, blocks_1_ln1_getitem_3)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    del blocks_1_ln2_add, blocks_1_ln1_getitem_3
    # blocks.0.out
    blocks_0_out_view_2 = aten.reshape.default(blocks_1_ln2_add_1, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    blocks_0_out_mm = aten.mm.default(blocks_0_out_view_2, blocks_0_out_weight)  # [512, 8192] -> local [256, 4096] (S(0), S(1))
    blocks_0_out_t_1 = aten.t.default(blocks_0_out_view_2)  # [2048, 512] -> local [2048, 256] (S(1), R)
    blocks_0_out_t_1__r16 = rt.all_gather(blocks_0_out_t_1, 'dp', dim=1)  # r16 backward: (S(1), R) -> (R, R), 4.2 MB, 7.7 us
    del blocks_0_out_t_1
    blocks_0_out_view__r17 = rt.all_gather(blocks_0_out_view, 'dp', dim=0)  # r17 backward: (S(0), S(1)) -> (R, S(1)), 8.4 MB, 12.3 us
    del blocks_0_out_view
    grad_blocks_0_out_weight = aten.mm.default(blocks_0_out_t_1__r16, blocks_0_out_view__r17)  # [2048, 8192] -> local [2048, 4096] (R, S(1))
    del blocks_0_out_t_1__r16, blocks_0_out_view__r17
    blocks_0_out_sum = aten.sum.dim_IntList(blocks_0_out_view_2, [0], True)  # [1, 2048] -> local [1, 2048] (P, R)
    del blocks_0_out_view_2
    grad_blocks_0_out_bias = aten.reshape.default(blocks_0_out_sum, [2048])  # [2048] -> local [2048] (P, R)
    del blocks_0_out_sum
    if sync:
        grad_blocks_0_out_bias = accumulate(grad_blocks_0_out_bias, unsynced, 'blocks.0.out.bias')
        grad_blocks_0_out_bias__r33_pending = rt.start_all_reduce(grad_blocks_0_out_bias, 'dp')  # r33 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_0_out_bias
    blocks_0_out_view_3 = aten.reshape.default(blocks_0_out_mm, [4, 64, 4096])  # [8, 64, 8192] -> local [4, 64, 4096] (S(0), S(2))
    del blocks_0_out_mm
    # blocks.0
    blocks_0_gelu_backward = aten.gelu_backward.default(blocks_0_out_view_3, blocks_0_fc_view_1)  # [8, 64, 8192] -> local [4, 64, 4096] (S(0), S(2))
    del blocks_0_fc_view_1, blocks_0_out_view_3
    # blocks.0.fc
    blocks_0_fc_view_2 = aten.reshape.default(blocks_0_gelu_backward, [256, 4096])  # [512, 8192] -> local [256, 4096] (S(0), S(1))
    del blocks_0_gelu_backward
    blocks_0_fc_mm = aten.mm.default(blocks_0_fc_view_2, blocks_0_fc_weight)  # [512, 2048] -> local [256, 2048] (S(0), P)
    blocks_0_fc_t_1 = aten.t.default(blocks_0_fc_view_2)  # [8192, 512] -> local [4096, 256] (S(1), S(0))
    grad_blocks_0_fc_weight = aten.mm.default(blocks_0_fc_t_1, blocks_0_fc_view)  # [8192, 2048] -> local [4096, 2048] (P, S(0))
    del blocks_0_fc_view, blocks_0_fc_t_1
    if sync:
        grad_blocks_0_fc_weight = accumulate(grad_blocks_0_fc_weight, unsynced, 'blocks.0.fc.weight')
        grad_blocks_0_fc_weight__r51_pending = rt.start_all_reduce(grad_blocks_0_fc_weight, 'dp')  # r51 backward: (P, S(0)) -> (R, S(0)), 33.6 MB, 78.6 us, overlaps the rest of backward
        del grad_blocks_0_fc_weight
    blocks_0_fc_sum = aten.sum.dim_IntList(blocks_0_fc_view_2, [0], True)  # [1, 8192] -> local [1, 4096] (P, S(1))
    del blocks_0_fc_view_2
    grad_blocks_0_fc_bias = aten.reshape.default(blocks_0_fc_sum, [4096])  # [8192] -> local [4096] (P, S(0))
    del blocks_0_fc_sum
    if sync:
        grad_blocks_0_fc_bias = accumulate(grad_blocks_0_fc_bias, unsynced, 'blocks.0.fc.bias')
        grad_blocks_0_fc_bias__r32_pending = rt.start_all_reduce(grad_blocks_0_fc_bias, 'dp')  # r32 backward: (P, S(0)) -> (R, S(0)), 16.4 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_0_fc_bias
    blocks_0_fc_view_3 = aten.reshape.default(blocks_0_fc_mm, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_0_fc_mm
    blocks_0_fc_view_3__r18 = rt.all_reduce(blocks_0_fc_view_3, 'tp', last_read=True)  # r18 backward: (S(0), P) -> (S(0), R), 2.1 MB, 8.7 us
    del blocks_0_fc_view_3
    # blocks.0.ln2
    blocks_0_ln2_native_layer_norm_backward = aten.native_layer_norm_backward.default(blocks_0_fc_view_3__r18, blocks_0_add, [2048], blocks_0_ln2_getitem_1, blocks_0_ln2_getitem_2, blocks_0_ln2_weight, blocks_0_ln2_bias, [True, True, True])  # -> (S(0), R), (P, R), (P, R)
    del blocks_0_add, blocks_0_ln2_getitem_1, blocks_0_ln2_getitem_2, blocks_0_fc_view_3__r18
    blocks_0_ln2_getitem_3 = blocks_0_ln2_native_layer_norm_backward[0]  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    grad_blocks_0_ln2_weight = blocks_0_ln2_native_layer_norm_backward[1]  # [2048] -> local [2048] (P, R)
    if sync:
        grad_blocks_0_ln2_weight = accumulate(grad_blocks_0_ln2_weight, unsynced, 'blocks.0.ln2.weight')
        grad_blocks_0_ln2_weight__r30_pending = rt.start_all_reduce(grad_blocks_0_ln2_weight, 'dp')  # r30 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_0_ln2_weight
    grad_blocks_0_ln2_bias = blocks_0_ln2_native_layer_norm_backward[2]  # [2048] -> local [2048] (P, R)
    del blocks_0_ln2_native_layer_norm_backward
    if sync:
        grad_blocks_0_ln2_bias = accumulate(grad_blocks_0_ln2_bias, unsynced, 'blocks.0.ln2.bias')
        grad_blocks_0_ln2_bias__r31_pending = rt.start_all_reduce(grad_blocks_0_ln2_bias, 'dp')  # r31 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_0_ln2_bias
    # blocks.1.ln2
    blocks_1_ln2_add_2 = aten.add.Tensor(blocks_1_ln2_add_1, blocks_0_ln2_getitem_3)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    del blocks_1_ln2_add_1, blocks_0_ln2_getitem_3
    # blocks.0.attn.proj
    blocks_0_attn_proj_view_2 = aten.reshape.default(blocks_1_ln2_add_2, [256, 2048])  # [512, 2048] -> local [256, 2048] (S(0), R)
    blocks_0_attn_proj_mm = aten.mm.default(blocks_0_attn_proj_view_2, blocks_0_attn_proj_weight)  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    blocks_0_attn_proj_t_1 = aten.t.default(blocks_0_attn_proj_view_2)  # [2048, 512] -> local [2048, 256] (S(1), R)
    grad_blocks_0_attn_proj_weight = aten.mm.default(blocks_0_attn_proj_t_1, blocks_0_attn_proj_view)  # [2048, 2048] -> local [2048, 1024] (P, S(1))
    del blocks_0_attn_proj_view, blocks_0_attn_proj_t_1
    if sync:
        grad_blocks_0_attn_proj_weight = accumulate(grad_blocks_0_attn_proj_weight, unsynced, 'blocks.0.attn.proj.weight')
        grad_blocks_0_attn_proj_weight__r52_pending = rt.start_all_reduce(grad_blocks_0_attn_proj_weight, 'dp')  # r52 backward: (P, S(1)) -> (R, S(1)), 8.4 MB, 19.9 us, overlaps the rest of backward
        del grad_blocks_0_attn_proj_weight
    blocks_0_attn_proj_sum = aten.sum.dim_IntList(blocks_0_attn_proj_view_2, [0], True)  # [1, 2048] -> local [1, 2048] (P, R)
    del blocks_0_attn_proj_view_2
    grad_blocks_0_attn_proj_bias = aten.reshape.default(blocks_0_attn_proj_sum, [2048])  # [2048] -> local [2048] (P, R)
    del blocks_0_attn_proj_sum
    if sync:
        grad_blocks_0_attn_proj_bias = accumulate(grad_blocks_0_attn_proj_bias, unsynced, 'blocks.0.attn.proj.bias')
        grad_blocks_0_attn_proj_bias__r29_pending = rt.start_all_reduce(grad_blocks_0_attn_proj_bias, 'dp')  # r29 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_0_attn_proj_bias
    blocks_0_attn_proj_view_3 = aten.reshape.default(blocks_0_attn_proj_mm, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_0_attn_proj_mm
    # blocks.0.attn
    blocks_0_attn_view_4 = aten.reshape.default(blocks_0_attn_proj_view_3, [4, 64, 16, 64])  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_0_attn_proj_view_3
    blocks_0_attn_transpose_4 = aten.transpose.int(blocks_0_attn_view_4, 1, 2)  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    del blocks_0_attn_view_4
    blocks_0_attn_detach_1 = aten.detach.default(blocks_0_attn_detach)  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    del blocks_0_attn_detach
    attention_backward_1 = kernels.attention_backward(blocks_0_attn_transpose_4, blocks_0_attn_transpose, blocks_0_attn_transpose_1, blocks_0_attn_transpose_2, blocks_0_attn_detach_1, blocks_0_attn_getitem_1, 0.0, True)  # -> (S(0), S(1)), (S(0), S(1)), (S(0), S(1))
    del blocks_0_attn_transpose, blocks_0_attn_transpose_1, blocks_0_attn_transpose_2, blocks_0_attn_getitem_1, blocks_0_attn_transpose_4, blocks_0_attn_detach_1
    blocks_0_attn_getitem_2 = attention_backward_1[0]  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    blocks_0_attn_getitem_3 = attention_backward_1[1]  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    blocks_0_attn_getitem_4 = attention_backward_1[2]  # [8, 32, 64, 64] -> local [4, 16, 64, 64] (S(0), S(1))
    del attention_backward_1
    blocks_0_attn_transpose_5 = aten.transpose.int(blocks_0_attn_getitem_4, 1, 2)  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_0_attn_getitem_4
    blocks_0_attn_view_5 = aten.reshape.default(blocks_0_attn_transpose_5, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_0_attn_transpose_5
    # blocks.0.attn.v
    blocks_0_attn_v_view_2 = aten.reshape.default(blocks_0_attn_view_5, [256, 1024])  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_0_attn_view_5
    blocks_0_attn_v_mm = aten.mm.default(blocks_0_attn_v_view_2, blocks_0_attn_v_weight)  # [512, 2048] -> local [256, 2048] (S(0), P)
    blocks_0_attn_v_t_1 = aten.t.default(blocks_0_attn_v_view_2)  # [2048, 512] -> local [1024, 256] (S(1), S(0))
    grad_blocks_0_attn_v_weight = aten.mm.default(blocks_0_attn_v_t_1, blocks_0_attn_v_view)  # [2048, 2048] -> local [1024, 2048] (P, S(0))
    del blocks_0_attn_v_view, blocks_0_attn_v_t_1
    if sync:
        grad_blocks_0_attn_v_weight = accumulate(grad_blocks_0_attn_v_weight, unsynced, 'blocks.0.attn.v.weight')
        grad_blocks_0_attn_v_weight__r53_pending = rt.start_all_reduce(grad_blocks_0_attn_v_weight, 'dp')  # r53 backward: (P, S(0)) -> (R, S(0)), 8.4 MB, 19.9 us, overlaps the rest of backward
        del grad_blocks_0_attn_v_weight
    blocks_0_attn_v_sum = aten.sum.dim_IntList(blocks_0_attn_v_view_2, [0], True)  # [1, 2048] -> local [1, 1024] (P, S(1))
    del blocks_0_attn_v_view_2
    grad_blocks_0_attn_v_bias = aten.reshape.default(blocks_0_attn_v_sum, [1024])  # [2048] -> local [1024] (P, S(0))
    del blocks_0_attn_v_sum
    if sync:
        grad_blocks_0_attn_v_bias = accumulate(grad_blocks_0_attn_v_bias, unsynced, 'blocks.0.attn.v.bias')
        grad_blocks_0_attn_v_bias__r28_pending = rt.start_all_reduce(grad_blocks_0_attn_v_bias, 'dp')  # r28 backward: (P, S(0)) -> (R, S(0)), 4.1 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_0_attn_v_bias
    blocks_0_attn_v_view_3 = aten.reshape.default(blocks_0_attn_v_mm, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_0_attn_v_mm
    # blocks.0.attn
    blocks_0_attn_transpose_6 = aten.transpose.int(blocks_0_attn_getitem_3, 1, 2)  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_0_attn_getitem_3
    blocks_0_attn_view_6 = aten.reshape.default(blocks_0_attn_transpose_6, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_0_attn_transpose_6
    # blocks.0.attn.k
    blocks_0_attn_k_view_2 = aten.reshape.default(blocks_0_attn_view_6, [256, 1024])  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_0_attn_view_6
    blocks_0_attn_k_mm = aten.mm.default(blocks_0_attn_k_view_2, blocks_0_attn_k_weight)  # [512, 2048] -> local [256, 2048] (S(0), P)
    blocks_0_attn_k_t_1 = aten.t.default(blocks_0_attn_k_view_2)  # [2048, 512] -> local [1024, 256] (S(1), S(0))
    grad_blocks_0_attn_k_weight = aten.mm.default(blocks_0_attn_k_t_1, blocks_0_attn_k_view)  # [2048, 2048] -> local [1024, 2048] (P, S(0))
    del blocks_0_attn_k_view, blocks_0_attn_k_t_1
    if sync:
        grad_blocks_0_attn_k_weight = accumulate(grad_blocks_0_attn_k_weight, unsynced, 'blocks.0.attn.k.weight')
        grad_blocks_0_attn_k_weight__r54_pending = rt.start_all_reduce(grad_blocks_0_attn_k_weight, 'dp')  # r54 backward: (P, S(0)) -> (R, S(0)), 8.4 MB, 19.9 us, overlaps the rest of backward
        del grad_blocks_0_attn_k_weight
    blocks_0_attn_k_sum = aten.sum.dim_IntList(blocks_0_attn_k_view_2, [0], True)  # [1, 2048] -> local [1, 1024] (P, S(1))
    del blocks_0_attn_k_view_2
    grad_blocks_0_attn_k_bias = aten.reshape.default(blocks_0_attn_k_sum, [1024])  # [2048] -> local [1024] (P, S(0))
    del blocks_0_attn_k_sum
    if sync:
        grad_blocks_0_attn_k_bias = accumulate(grad_blocks_0_attn_k_bias, unsynced, 'blocks.0.attn.k.bias')
        grad_blocks_0_attn_k_bias__r27_pending = rt.start_all_reduce(grad_blocks_0_attn_k_bias, 'dp')  # r27 backward: (P, S(0)) -> (R, S(0)), 4.1 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_0_attn_k_bias
    blocks_0_attn_k_view_3 = aten.reshape.default(blocks_0_attn_k_mm, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_0_attn_k_mm
    # blocks.0.attn.v
    blocks_0_attn_v_add = aten.add.Tensor(blocks_0_attn_v_view_3, blocks_0_attn_k_view_3)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_0_attn_v_view_3, blocks_0_attn_k_view_3
    # blocks.0.attn
    blocks_0_attn_transpose_7 = aten.transpose.int(blocks_0_attn_getitem_2, 1, 2)  # [8, 64, 32, 64] -> local [4, 64, 16, 64] (S(0), S(2))
    del blocks_0_attn_getitem_2
    blocks_0_attn_view_7 = aten.reshape.default(blocks_0_attn_transpose_7, [4, 64, 1024])  # [8, 64, 2048] -> local [4, 64, 1024] (S(0), S(2))
    del blocks_0_attn_transpose_7
    # blocks.0.attn.q
    blocks_0_attn_q_view_2 = aten.reshape.default(blocks_0_attn_view_7, [256, 1024])  # [512, 2048] -> local [256, 1024] (S(0), S(1))
    del blocks_0_attn_view_7
    blocks_0_attn_q_mm = aten.mm.default(blocks_0_attn_q_view_2, blocks_0_attn_q_weight)  # [512, 2048] -> local [256, 2048] (S(0), P)
    blocks_0_attn_q_t_1 = aten.t.default(blocks_0_attn_q_view_2)  # [2048, 512] -> local [1024, 256] (S(1), S(0))
    grad_blocks_0_attn_q_weight = aten.mm.default(blocks_0_attn_q_t_1, blocks_0_attn_q_view)  # [2048, 2048] -> local [1024, 2048] (P, S(0))
    del blocks_0_attn_q_view, blocks_0_attn_q_t_1
    if sync:
        grad_blocks_0_attn_q_weight = accumulate(grad_blocks_0_attn_q_weight, unsynced, 'blocks.0.attn.q.weight')
        grad_blocks_0_attn_q_weight__r55_pending = rt.start_all_reduce(grad_blocks_0_attn_q_weight, 'dp')  # r55 backward: (P, S(0)) -> (R, S(0)), 8.4 MB, 19.9 us, overlaps the rest of backward
        del grad_blocks_0_attn_q_weight
    blocks_0_attn_q_sum = aten.sum.dim_IntList(blocks_0_attn_q_view_2, [0], True)  # [1, 2048] -> local [1, 1024] (P, S(1))
    del blocks_0_attn_q_view_2
    grad_blocks_0_attn_q_bias = aten.reshape.default(blocks_0_attn_q_sum, [1024])  # [2048] -> local [1024] (P, S(0))
    del blocks_0_attn_q_sum
    if sync:
        grad_blocks_0_attn_q_bias = accumulate(grad_blocks_0_attn_q_bias, unsynced, 'blocks.0.attn.q.bias')
        grad_blocks_0_attn_q_bias__r26_pending = rt.start_all_reduce(grad_blocks_0_attn_q_bias, 'dp')  # r26 backward: (P, S(0)) -> (R, S(0)), 4.1 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_0_attn_q_bias
    blocks_0_attn_q_view_3 = aten.reshape.default(blocks_0_attn_q_mm, [4, 64, 2048])  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_0_attn_q_mm
    # blocks.0.attn.v
    blocks_0_attn_v_add_1 = aten.add.Tensor(blocks_0_attn_v_add, blocks_0_attn_q_view_3)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), P)
    del blocks_0_attn_v_add, blocks_0_attn_q_view_3
    blocks_0_attn_v_add_1__r19 = rt.all_reduce(blocks_0_attn_v_add_1, 'tp', last_read=True)  # r19 backward: (S(0), P) -> (S(0), R), 2.1 MB, 8.7 us
    del blocks_0_attn_v_add_1
    # blocks.0.ln1
    blocks_0_ln1_native_layer_norm_backward = aten.native_layer_norm_backward.default(blocks_0_attn_v_add_1__r19, add, [2048], blocks_0_ln1_getitem_1, blocks_0_ln1_getitem_2, blocks_0_ln1_weight, blocks_0_ln1_bias, [True, True, True])  # -> (S(0), R), (P, R), (P, R)
    del add, blocks_0_ln1_getitem_1, blocks_0_ln1_getitem_2, blocks_0_attn_v_add_1__r19
    blocks_0_ln1_getitem_3 = blocks_0_ln1_native_layer_norm_backward[0]  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    grad_blocks_0_ln1_weight = blocks_0_ln1_native_layer_norm_backward[1]  # [2048] -> local [2048] (P, R)
    if sync:
        grad_blocks_0_ln1_weight = accumulate(grad_blocks_0_ln1_weight, unsynced, 'blocks.0.ln1.weight')
        grad_blocks_0_ln1_weight__r24_pending = rt.start_all_reduce(grad_blocks_0_ln1_weight, 'dp')  # r24 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_0_ln1_weight
    grad_blocks_0_ln1_bias = blocks_0_ln1_native_layer_norm_backward[2]  # [2048] -> local [2048] (P, R)
    del blocks_0_ln1_native_layer_norm_backward
    if sync:
        grad_blocks_0_ln1_bias = accumulate(grad_blocks_0_ln1_bias, unsynced, 'blocks.0.ln1.bias')
        grad_blocks_0_ln1_bias__r25_pending = rt.start_all_reduce(grad_blocks_0_ln1_bias, 'dp')  # r25 backward: (P, R) -> (R, R), 8.2 KB, 0.0 us, overlaps the rest of backward
        del grad_blocks_0_ln1_bias
    # blocks.1.ln2
    blocks_1_ln2_add_3 = aten.add.Tensor(blocks_1_ln2_add_2, blocks_0_ln1_getitem_3)  # [8, 64, 2048] -> local [4, 64, 2048] (S(0), R)
    del blocks_1_ln2_add_2, blocks_0_ln1_getitem_3
    # <model>
    sum_13 = aten.sum.dim_IntList(blocks_1_ln2_add_3, [0], True)  # [1, 64, 2048] -> local [1, 64, 2048] (P, R)
    view_82 = aten.reshape.default(sum_13, [64, 2048])  # [64, 2048] -> local [64, 2048] (P, R)
    del sum_13
    view_82__r20 = rt.reduce_scatter(view_82, 'dp', dim=0, last_read=True)  # r20 backward: (P, R) -> (S(0), R), 524.3 KB, 3.6 us
    del view_82
    arange__r21 = rt.shard(arange, 'dp', dim=0)  # r21 backward: (R, R) -> (S(0), R), 0 B, 0.0 us
    del arange
    # wpe
    grad_wpe_weight = aten.embedding_dense_backward.default(view_82__r20, arange__r21, 64, -1, False)  # [64, 2048] -> local [64, 2048] (P, R)
    del view_82__r20, arange__r21
    if sync:
        grad_wpe_weight = accumulate(grad_wpe_weight, unsynced, 'wpe.weight')
        grad_wpe_weight__r23_pending = rt.start_all_reduce(grad_wpe_weight, 'dp')  # r23 backward: (P, R) -> (R, R), 524.3 KB, 1.2 us, overlaps the rest of backward
        del grad_wpe_weight
    # wte
    grad_wte_weight = aten.embedding_dense_backward.default(blocks_1_ln2_add_3, idx, 256, -1, False)  # [256, 2048] -> local [256, 2048] (P, R)
    del blocks_1_ln2_add_3
    if sync:
        grad_wte_weight = accumulate(grad_wte_weight, unsynced, 'wte.weight')
        grad_wte_weight__r22_pending = rt.start_all_reduce(grad_wte_weight, 'dp')  # r22 backward: (P, R) -> (R, R), 2.1 MB, 5.0 us, overlaps the rest of backward
        del grad_wte_weight
    if not sync:  # model.no_sync(): the local gradients, left for the next synced backward
        return {
            'wte.weight': grad_wte_weight,
            'wpe.weight': grad_wpe_weight,
            'blocks.0.ln1.weight': grad_blocks_0_ln1_weight,
            'blocks.0.ln1.bias': grad_blocks_0_ln1_bias,
            'blocks.0.attn.q.weight': grad_blocks_0_attn_q_weight,
            'blocks.0.attn.q.bias': grad_blocks_0_attn_q_bias,
            'blocks.0.attn.k.weight': grad_blocks_0_attn_k_weight,
            'blocks.0.attn.k.bias': grad_blocks_0_attn_k_bias,
            'blocks.0.attn.v.weight': grad_blocks_0_attn_v_weight,
            'blocks.0.attn.v.bias': grad_blocks_0_attn_v_bias,
            'blocks.0.attn.proj.weight': grad_blocks_0_attn_proj_weight,
            'blocks.0.attn.proj.bias': grad_blocks_0_attn_proj_bias,
            'blocks.0.ln2.weight': grad_blocks_0_ln2_weight,
            'blocks.0.ln2.bias': grad_blocks_0_ln2_bias,
            'blocks.0.fc.weight': grad_blocks_0_fc_weight,
            'blocks.0.fc.bias': grad_blocks_0_fc_bias,
            'blocks.0.out.weight': grad_blocks_0_out_weight,
            'blocks.0.out.bias': grad_blocks_0_out_bias,
            'blocks.1.ln1.weight': grad_blocks_1_ln1_weight,
            'blocks.1.ln1.bias': grad_blocks_1_ln1_bias,
            'blocks.1.attn.q.weight': grad_blocks_1_attn_q_weight,
            'blocks.1.attn.q.bias': grad_blocks_1_attn_q_bias,
            'blocks.1.attn.k.weight': grad_blocks_1_attn_k_weight,
            'blocks.1.attn.k.bias': grad_blocks_1_attn_k_bias,
            'blocks.1.attn.v.weight': grad_blocks_1_attn_v_weight,
            'blocks.1.attn.v.bias': grad_blocks_1_attn_v_bias,
            'blocks.1.attn.proj.weight': grad_blocks_1_attn_proj_weight,
            'blocks.1.attn.proj.bias': grad_blocks_1_attn_proj_bias,
            'blocks.1.ln2.weight': grad_blocks_1_ln2_weight,
            'blocks.1.ln2.bias': grad_blocks_1_ln2_bias,
            'blocks.1.fc.weight': grad_blocks_1_fc_weight,
            'blocks.1.fc.bias': grad_blocks_1_fc_bias,
            'blocks.1.out.weight': grad_blocks_1_out_weight,
            'blocks.1.out.bias': grad_blocks_1_out_bias,
            'ln_f.weight': grad_ln_f_weight,
            'ln_f.bias': grad_ln_f_bias,
            'head.weight': grad_head_weight,
        }
    grad_wte_weight__r22 = rt.wait(grad_wte_weight__r22_pending)  # r22: the gradient sync started above
    del grad_wte_weight__r22_pending
    grad_wpe_weight__r23 = rt.wait(grad_wpe_weight__r23_pending)  # r23: the gradient sync started above
    del grad_wpe_weight__r23_pending
    grad_blocks_0_ln1_weight__r24 = rt.wait(grad_blocks_0_ln1_weight__r24_pending)  # r24: the gradient sync started above
    del grad_blocks_0_ln1_weight__r24_pending
    grad_blocks_0_ln1_bias__r25 = rt.wait(grad_blocks_0_ln1_bias__r25_pending)  # r25: the gradient sync started above
    del grad_blocks_0_ln1_bias__r25_pending
    grad_blocks_0_attn_q_weight__r55 = rt.wait(grad_blocks_0_attn_q_weight__r55_pending)  # r55: the gradient sync started above
    del grad_blocks_0_attn_q_weight__r55_pending
    grad_blocks_0_attn_q_bias__r26 = rt.wait(grad_blocks_0_attn_q_bias__r26_pending)  # r26: the gradient sync started above
    del grad_blocks_0_attn_q_bias__r26_pending
    grad_blocks_0_attn_k_weight__r54 = rt.wait(grad_blocks_0_attn_k_weight__r54_pending)  # r54: the gradient sync started above
    del grad_blocks_0_attn_k_weight__r54_pending
    grad_blocks_0_attn_k_bias__r27 = rt.wait(grad_blocks_0_attn_k_bias__r27_pending)  # r27: the gradient sync started above
    del grad_blocks_0_attn_k_bias__r27_pending
    grad_blocks_0_attn_v_weight__r53 = rt.wait(grad_blocks_0_attn_v_weight__r53_pending)  # r53: the gradient sync started above
    del grad_blocks_0_attn_v_weight__r53_pending
    grad_blocks_0_attn_v_bias__r28 = rt.wait(grad_blocks_0_attn_v_bias__r28_pending)  # r28: the gradient sync started above
    del grad_blocks_0_attn_v_bias__r28_pending
    grad_blocks_0_attn_proj_weight__r52 = rt.wait(grad_blocks_0_attn_proj_weight__r52_pending)  # r52: the gradient sync started above
    del grad_blocks_0_attn_proj_weight__r52_pending
    grad_blocks_0_attn_proj_bias__r29 = rt.wait(grad_blocks_0_attn_proj_bias__r29_pending)  # r29: the gradient sync started above
    del grad_blocks_0_attn_proj_bias__r29_pending
    grad_blocks_0_ln2_weight__r30 = rt.wait(grad_blocks_0_ln2_weight__r30_pending)  # r30: the gradient sync started above
    del grad_blocks_0_ln2_weight__r30_pending
    grad_blocks_0_ln2_bias__r31 = rt.wait(grad_blocks_0_ln2_bias__r31_pending)  # r31: the gradient sync started above
    del grad_blocks_0_ln2_bias__r31_pending
    grad_blocks_0_fc_weight__r51 = rt.wait(grad_blocks_0_fc_weight__r51_pending)  # r51: the gradient sync started above
    del grad_blocks_0_fc_weight__r51_pending
    grad_blocks_0_fc_bias__r32 = rt.wait(grad_blocks_0_fc_bias__r32_pending)  # r32: the gradient sync started above
    del grad_blocks_0_fc_bias__r32_pending
    grad_blocks_0_out_bias__r33 = rt.wait(grad_blocks_0_out_bias__r33_pending)  # r33: the gradient sync started above
    del grad_blocks_0_out_bias__r33_pending
    grad_blocks_1_ln1_weight__r34 = rt.wait(grad_blocks_1_ln1_weight__r34_pending)  # r34: the gradient sync started above
    del grad_blocks_1_ln1_weight__r34_pending
    grad_blocks_1_ln1_bias__r35 = rt.wait(grad_blocks_1_ln1_bias__r35_pending)  # r35: the gradient sync started above
    del grad_blocks_1_ln1_bias__r35_pending
    grad_blocks_1_attn_q_weight__r50 = rt.wait(grad_blocks_1_attn_q_weight__r50_pending)  # r50: the gradient sync started above
    del grad_blocks_1_attn_q_weight__r50_pending
    grad_blocks_1_attn_q_bias__r36 = rt.wait(grad_blocks_1_attn_q_bias__r36_pending)  # r36: the gradient sync started above
    del grad_blocks_1_attn_q_bias__r36_pending
    grad_blocks_1_attn_k_weight__r49 = rt.wait(grad_blocks_1_attn_k_weight__r49_pending)  # r49: the gradient sync started above
    del grad_blocks_1_attn_k_weight__r49_pending
    grad_blocks_1_attn_k_bias__r37 = rt.wait(grad_blocks_1_attn_k_bias__r37_pending)  # r37: the gradient sync started above
    del grad_blocks_1_attn_k_bias__r37_pending
    grad_blocks_1_attn_v_weight__r48 = rt.wait(grad_blocks_1_attn_v_weight__r48_pending)  # r48: the gradient sync started above
    del grad_blocks_1_attn_v_weight__r48_pending
    grad_blocks_1_attn_v_bias__r38 = rt.wait(grad_blocks_1_attn_v_bias__r38_pending)  # r38: the gradient sync started above
    del grad_blocks_1_attn_v_bias__r38_pending
    grad_blocks_1_attn_proj_weight__r47 = rt.wait(grad_blocks_1_attn_proj_weight__r47_pending)  # r47: the gradient sync started above
    del grad_blocks_1_attn_proj_weight__r47_pending
    grad_blocks_1_attn_proj_bias__r39 = rt.wait(grad_blocks_1_attn_proj_bias__r39_pending)  # r39: the gradient sync started above
    del grad_blocks_1_attn_proj_bias__r39_pending
    grad_blocks_1_ln2_weight__r40 = rt.wait(grad_blocks_1_ln2_weight__r40_pending)  # r40: the gradient sync started above
    del grad_blocks_1_ln2_weight__r40_pending
    grad_blocks_1_ln2_bias__r41 = rt.wait(grad_blocks_1_ln2_bias__r41_pending)  # r41: the gradient sync started above
    del grad_blocks_1_ln2_bias__r41_pending
    grad_blocks_1_fc_bias__r42 = rt.wait(grad_blocks_1_fc_bias__r42_pending)  # r42: the gradient sync started above
    del grad_blocks_1_fc_bias__r42_pending
    grad_blocks_1_out_bias__r43 = rt.wait(grad_blocks_1_out_bias__r43_pending)  # r43: the gradient sync started above
    del grad_blocks_1_out_bias__r43_pending
    grad_ln_f_weight__r44 = rt.wait(grad_ln_f_weight__r44_pending)  # r44: the gradient sync started above
    del grad_ln_f_weight__r44_pending
    grad_ln_f_bias__r45 = rt.wait(grad_ln_f_bias__r45_pending)  # r45: the gradient sync started above
    del grad_ln_f_bias__r45_pending
    grad_head_weight__r46 = rt.wait(grad_head_weight__r46_pending)  # r46: the gradient sync started above
    del grad_head_weight__r46_pending
    return {
        'wte.weight': grad_wte_weight__r22,
        'wpe.weight': grad_wpe_weight__r23,
        'blocks.0.ln1.weight': grad_blocks_0_ln1_weight__r24,
        'blocks.0.ln1.bias': grad_blocks_0_ln1_bias__r25,
        'blocks.0.attn.q.weight': grad_blocks_0_attn_q_weight__r55,
        'blocks.0.attn.q.bias': grad_blocks_0_attn_q_bias__r26,
        'blocks.0.attn.k.weight': grad_blocks_0_attn_k_weight__r54,
        'blocks.0.attn.k.bias': grad_blocks_0_attn_k_bias__r27,
        'blocks.0.attn.v.weight': grad_blocks_0_attn_v_weight__r53,
        'blocks.0.attn.v.bias': grad_blocks_0_attn_v_bias__r28,
        'blocks.0.attn.proj.weight': grad_blocks_0_attn_proj_weight__r52,
        'blocks.0.attn.proj.bias': grad_blocks_0_attn_proj_bias__r29,
        'blocks.0.ln2.weight': grad_blocks_0_ln2_weight__r30,
        'blocks.0.ln2.bias': grad_blocks_0_ln2_bias__r31,
        'blocks.0.fc.weight': grad_blocks_0_fc_weight__r51,
        'blocks.0.fc.bias': grad_blocks_0_fc_bias__r32,
        'blocks.0.out.weight': accumulate(grad_blocks_0_out_weight, unsynced, 'blocks.0.out.weight'),
        'blocks.0.out.bias': grad_blocks_0_out_bias__r33,
        'blocks.1.ln1.weight': grad_blocks_1_ln1_weight__r34,
        'blocks.1.ln1.bias': grad_blocks_1_ln1_bias__r35,
        'blocks.1.attn.q.weight': grad_blocks_1_attn_q_weight__r50,
        'blocks.1.attn.q.bias': grad_blocks_1_attn_q_bias__r36,
        'blocks.1.attn.k.weight': grad_blocks_1_attn_k_weight__r49,
        'blocks.1.attn.k.bias': grad_blocks_1_attn_k_bias__r37,
        'blocks.1.attn.v.weight': grad_blocks_1_attn_v_weight__r48,
        'blocks.1.attn.v.bias': grad_blocks_1_attn_v_bias__r38,
        'blocks.1.attn.proj.weight': grad_blocks_1_attn_proj_weight__r47,
        'blocks.1.attn.proj.bias': grad_blocks_1_attn_proj_bias__r39,
        'blocks.1.ln2.weight': grad_blocks_1_ln2_weight__r40,
        'blocks.1.ln2.bias': grad_blocks_1_ln2_bias__r41,
        'blocks.1.fc.weight': accumulate(grad_blocks_1_fc_weight, unsynced, 'blocks.1.fc.weight'),
        'blocks.1.fc.bias': grad_blocks_1_fc_bias__r42,
        'blocks.1.out.weight': accumulate(grad_blocks_1_out_weight, unsynced, 'blocks.1.out.weight'),
        'blocks.1.out.bias': grad_blocks_1_out_bias__r43,
        'ln_f.weight': grad_ln_f_weight__r44,
        'ln_f.bias': grad_ln_f_bias__r45,
        'head.weight': grad_head_weight__r46,
    }


def accumulate(grad, unsynced, name):
    """``grad`` plus the local gradient of ``name`` that earlier micro-batches left unsynced (no_sync)."""
    earlier = unsynced.pop(name, None)
    return grad if earlier is None else grad + earlier
