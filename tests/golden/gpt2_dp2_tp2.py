# autopar: per-rank training step for torch.distributed (generated; do not edit)
# plan f6a976a7bf90 | graph 6d97ab77c17ffb6f | mesh (dp=2, tp=2) | hardware h100-sxm
# predicted step 0.1920 ms = compute 0.1920 ms + communication 0.0000 ms
# passes:
#   shapes: 309 nodes
#   strategies: 309 nodes, 116 free, 1174 strategies, 0 fallbacks
#   cluster_layers: no repeated layers
#   solve_sharding: 116 variables groups, 220 edges, 27349 booleans, optimal, objective 0.1920 ms, gap 0.00%
#   collectives: 0 redistributions, 0 collectives
#   recompute: peak 10.9 MB per device at _log_softmax_backward_data
#   predict: step 0.1920 ms (compute 0.1920, communication 0.0000 + 0.0000 hidden), 0% of FLOPs sharded
# forward(rt, parameters..., buffers..., inputs...) -> (loss, saved, values, {buffer name: new value})
# backward(rt, parameters..., buffers..., inputs..., saved, grad_loss, sync, unsynced)
#     -> {parameter name: gradient}
# all on this rank's local shards; saved: the values forward keeps for backward;
# values: the model's other outputs, in their planned layouts.
import torch

from autopar.runtime import kernels  # kernels by what they compute, on any device

aten = torch.ops.aten

PLAN_HASH = 'f6a976a7bf90'
GRAPH_FINGERPRINT = '6d97ab77c17ffb6f'
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
    # wte_weight (parameter wte.weight): [256, 128] -> local [256, 128] (R, R)
    # wpe_weight (parameter wpe.weight): [32, 128] -> local [32, 128] (R, R)
    # blocks_0_ln1_weight (parameter blocks.0.ln1.weight): [128] -> local [128] (R, R)
    # blocks_0_ln1_bias (parameter blocks.0.ln1.bias): [128] -> local [128] (R, R)
    # blocks_0_attn_q_weight (parameter blocks.0.attn.q.weight): [128, 128] -> local [128, 128] (R, R)
    # blocks_0_attn_q_bias (parameter blocks.0.attn.q.bias): [128] -> local [128] (R, R)
    # blocks_0_attn_k_weight (parameter blocks.0.attn.k.weight): [128, 128] -> local [128, 128] (R, R)
    # blocks_0_attn_k_bias (parameter blocks.0.attn.k.bias): [128] -> local [128] (R, R)
    # blocks_0_attn_v_weight (parameter blocks.0.attn.v.weight): [128, 128] -> local [128, 128] (R, R)
    # blocks_0_attn_v_bias (parameter blocks.0.attn.v.bias): [128] -> local [128] (R, R)
    # blocks_0_attn_proj_weight (parameter blocks.0.attn.proj.weight): [128, 128] -> local [128, 128] (R, R)
    # blocks_0_attn_proj_bias (parameter blocks.0.attn.proj.bias): [128] -> local [128] (R, R)
    # blocks_0_ln2_weight (parameter blocks.0.ln2.weight): [128] -> local [128] (R, R)
    # blocks_0_ln2_bias (parameter blocks.0.ln2.bias): [128] -> local [128] (R, R)
    # blocks_0_fc_weight (parameter blocks.0.fc.weight): [512, 128] -> local [512, 128] (R, R)
    # blocks_0_fc_bias (parameter blocks.0.fc.bias): [512] -> local [512] (R, R)
    # blocks_0_out_weight (parameter blocks.0.out.weight): [128, 512] -> local [128, 512] (R, R)
    # blocks_0_out_bias (parameter blocks.0.out.bias): [128] -> local [128] (R, R)
    # blocks_1_ln1_weight (parameter blocks.1.ln1.weight): [128] -> local [128] (R, R)
    # blocks_1_ln1_bias (parameter blocks.1.ln1.bias): [128] -> local [128] (R, R)
    # blocks_1_attn_q_weight (parameter blocks.1.attn.q.weight): [128, 128] -> local [128, 128] (R, R)
    # blocks_1_attn_q_bias (parameter blocks.1.attn.q.bias): [128] -> local [128] (R, R)
    # blocks_1_attn_k_weight (parameter blocks.1.attn.k.weight): [128, 128] -> local [128, 128] (R, R)
    # blocks_1_attn_k_bias (parameter blocks.1.attn.k.bias): [128] -> local [128] (R, R)
    # blocks_1_attn_v_weight (parameter blocks.1.attn.v.weight): [128, 128] -> local [128, 128] (R, R)
    # blocks_1_attn_v_bias (parameter blocks.1.attn.v.bias): [128] -> local [128] (R, R)
    # blocks_1_attn_proj_weight (parameter blocks.1.attn.proj.weight): [128, 128] -> local [128, 128] (R, R)
    # blocks_1_attn_proj_bias (parameter blocks.1.attn.proj.bias): [128] -> local [128] (R, R)
    # blocks_1_ln2_weight (parameter blocks.1.ln2.weight): [128] -> local [128] (R, R)
    # blocks_1_ln2_bias (parameter blocks.1.ln2.bias): [128] -> local [128] (R, R)
    # blocks_1_fc_weight (parameter blocks.1.fc.weight): [512, 128] -> local [512, 128] (R, R)
    # blocks_1_fc_bias (parameter blocks.1.fc.bias): [512] -> local [512] (R, R)
    # blocks_1_out_weight (parameter blocks.1.out.weight): [128, 512] -> local [128, 512] (R, R)
    # blocks_1_out_bias (parameter blocks.1.out.bias): [128] -> local [128] (R, R)
    # ln_f_weight (parameter ln_f.weight): [128] -> local [128] (R, R)
    # ln_f_bias (parameter ln_f.bias): [128] -> local [128] (R, R)
    # head_weight (parameter head.weight): [256, 128] -> local [256, 128] (R, R)
    # idx (input): [8, 32] -> local [8, 32] (R, R)
    # targets (input): [8, 32] -> local [8, 32] (R, R)

    # ---- forward ----
    # <model>
    arange = aten.arange.default(32, device=rt.device, pin_memory=False)  # [32] -> local [32] (R, R)
    # wte
    embedding = aten.embedding.default(wte_weight, idx)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    # wpe
    embedding_1 = aten.embedding.default(wpe_weight, arange)  # [32, 128] -> local [32, 128] (R, R)
    # <model>
    add = aten.add.Tensor(embedding, embedding_1)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del embedding, embedding_1
    # blocks.0.ln1
    native_layer_norm = aten.native_layer_norm.default(add, [128], blocks_0_ln1_weight, blocks_0_ln1_bias, 1e-05)  # -> (R, R), (R, R), (R, R)
    getitem = native_layer_norm[0]  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    getitem_1 = native_layer_norm[1]  # [8, 32, 1] -> local [8, 32, 1] (R, R)
    getitem_2 = native_layer_norm[2]  # [8, 32, 1] -> local [8, 32, 1] (R, R)
    del native_layer_norm
    # blocks.0.attn.q
    view = aten.reshape.default(getitem, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    t = aten.t.default(blocks_0_attn_q_weight)  # [128, 128] -> local [128, 128] (R, R)
    addmm = aten.addmm.default(blocks_0_attn_q_bias, view, t)  # [256, 128] -> local [256, 128] (R, R)
    del t
    view_1 = aten.reshape.default(addmm, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del addmm
    # blocks.0.attn
    view_2 = aten.reshape.default(view_1, [8, 32, 4, 32])  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del view_1
    transpose = aten.transpose.int(view_2, 1, 2)  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    del view_2
    # blocks.0.attn.k
    view_3 = aten.reshape.default(getitem, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    t_1 = aten.t.default(blocks_0_attn_k_weight)  # [128, 128] -> local [128, 128] (R, R)
    addmm_1 = aten.addmm.default(blocks_0_attn_k_bias, view_3, t_1)  # [256, 128] -> local [256, 128] (R, R)
    del t_1
    view_4 = aten.reshape.default(addmm_1, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del addmm_1
    # blocks.0.attn
    view_5 = aten.reshape.default(view_4, [8, 32, 4, 32])  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del view_4
    transpose_1 = aten.transpose.int(view_5, 1, 2)  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    del view_5
    # blocks.0.attn.v
    view_6 = aten.reshape.default(getitem, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del getitem
    t_2 = aten.t.default(blocks_0_attn_v_weight)  # [128, 128] -> local [128, 128] (R, R)
    addmm_2 = aten.addmm.default(blocks_0_attn_v_bias, view_6, t_2)  # [256, 128] -> local [256, 128] (R, R)
    del t_2
    view_7 = aten.reshape.default(addmm_2, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del addmm_2
    # blocks.0.attn
    view_8 = aten.reshape.default(view_7, [8, 32, 4, 32])  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del view_7
    transpose_2 = aten.transpose.int(view_8, 1, 2)  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    del view_8
    attention = kernels.attention_forward(transpose, transpose_1, transpose_2, 0.0, True)  # -> (R, R), (R, R)
    getitem_3 = attention[0]  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    getitem_4 = attention[1]  # [8, 4, 32] -> local [8, 4, 32] (R, R)
    del attention
    detach = aten.detach.default(getitem_3)  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    transpose_3 = aten.transpose.int(getitem_3, 1, 2)  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del getitem_3
    view_9 = aten.reshape.default(transpose_3, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del transpose_3
    # blocks.0.attn.proj
    view_10 = aten.reshape.default(view_9, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del view_9
    t_3 = aten.t.default(blocks_0_attn_proj_weight)  # [128, 128] -> local [128, 128] (R, R)
    addmm_3 = aten.addmm.default(blocks_0_attn_proj_bias, view_10, t_3)  # [256, 128] -> local [256, 128] (R, R)
    del t_3
    view_11 = aten.reshape.default(addmm_3, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del addmm_3
    # blocks.0
    add_1 = aten.add.Tensor(add, view_11)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del view_11
    # blocks.0.ln2
    native_layer_norm_1 = aten.native_layer_norm.default(add_1, [128], blocks_0_ln2_weight, blocks_0_ln2_bias, 1e-05)  # -> (R, R), (R, R), (R, R)
    getitem_5 = native_layer_norm_1[0]  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    getitem_6 = native_layer_norm_1[1]  # [8, 32, 1] -> local [8, 32, 1] (R, R)
    getitem_7 = native_layer_norm_1[2]  # [8, 32, 1] -> local [8, 32, 1] (R, R)
    del native_layer_norm_1
    # blocks.0.fc
    view_12 = aten.reshape.default(getitem_5, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del getitem_5
    t_4 = aten.t.default(blocks_0_fc_weight)  # [128, 512] -> local [128, 512] (R, R)
    addmm_4 = aten.addmm.default(blocks_0_fc_bias, view_12, t_4)  # [256, 512] -> local [256, 512] (R, R)
    del t_4
    view_13 = aten.reshape.default(addmm_4, [8, 32, 512])  # [8, 32, 512] -> local [8, 32, 512] (R, R)
    del addmm_4
    # blocks.0
    gelu = aten.gelu.default(view_13)  # [8, 32, 512] -> local [8, 32, 512] (R, R)
    # blocks.0.out
    view_14 = aten.reshape.default(gelu, [256, 512])  # [256, 512] -> local [256, 512] (R, R)
    del gelu
    t_5 = aten.t.default(blocks_0_out_weight)  # [512, 128] -> local [512, 128] (R, R)
    addmm_5 = aten.addmm.default(blocks_0_out_bias, view_14, t_5)  # [256, 128] -> local [256, 128] (R, R)
    del t_5
    view_15 = aten.reshape.default(addmm_5, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del addmm_5
    # blocks.0
    clone = aten.clone.default(view_15)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del view_15
    add_2 = aten.add.Tensor(add_1, clone)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del clone
    # blocks.1.ln1
    native_layer_norm_2 = aten.native_layer_norm.default(add_2, [128], blocks_1_ln1_weight, blocks_1_ln1_bias, 1e-05)  # -> (R, R), (R, R), (R, R)
    getitem_8 = native_layer_norm_2[0]  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    getitem_9 = native_layer_norm_2[1]  # [8, 32, 1] -> local [8, 32, 1] (R, R)
    getitem_10 = native_layer_norm_2[2]  # [8, 32, 1] -> local [8, 32, 1] (R, R)
    del native_layer_norm_2
    # blocks.1.attn.q
    view_16 = aten.reshape.default(getitem_8, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    t_6 = aten.t.default(blocks_1_attn_q_weight)  # [128, 128] -> local [128, 128] (R, R)
    addmm_6 = aten.addmm.default(blocks_1_attn_q_bias, view_16, t_6)  # [256, 128] -> local [256, 128] (R, R)
    del t_6
    view_17 = aten.reshape.default(addmm_6, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del addmm_6
    # blocks.1.attn
    view_18 = aten.reshape.default(view_17, [8, 32, 4, 32])  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del view_17
    transpose_4 = aten.transpose.int(view_18, 1, 2)  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    del view_18
    # blocks.1.attn.k
    view_19 = aten.reshape.default(getitem_8, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    t_7 = aten.t.default(blocks_1_attn_k_weight)  # [128, 128] -> local [128, 128] (R, R)
    addmm_7 = aten.addmm.default(blocks_1_attn_k_bias, view_19, t_7)  # [256, 128] -> local [256, 128] (R, R)
    del t_7
    view_20 = aten.reshape.default(addmm_7, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del addmm_7
    # blocks.1.attn
    view_21 = aten.reshape.default(view_20, [8, 32, 4, 32])  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del view_20
    transpose_5 = aten.transpose.int(view_21, 1, 2)  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    del view_21
    # blocks.1.attn.v
    view_22 = aten.reshape.default(getitem_8, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del getitem_8
    t_8 = aten.t.default(blocks_1_attn_v_weight)  # [128, 128] -> local [128, 128] (R, R)
    addmm_8 = aten.addmm.default(blocks_1_attn_v_bias, view_22, t_8)  # [256, 128] -> local [256, 128] (R, R)
    del t_8
    view_23 = aten.reshape.default(addmm_8, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del addmm_8
    # blocks.1.attn
    view_24 = aten.reshape.default(view_23, [8, 32, 4, 32])  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del view_23
    transpose_6 = aten.transpose.int(view_24, 1, 2)  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    del view_24
    attention_1 = kernels.attention_forward(transpose_4, transpose_5, transpose_6, 0.0, True)  # -> (R, R), (R, R)
    getitem_11 = attention_1[0]  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    getitem_12 = attention_1[1]  # [8, 4, 32] -> local [8, 4, 32] (R, R)
    del attention_1
    detach_1 = aten.detach.default(getitem_11)  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    transpose_7 = aten.transpose.int(getitem_11, 1, 2)  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del getitem_11
    view_25 = aten.reshape.default(transpose_7, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del transpose_7
    # blocks.1.attn.proj
    view_26 = aten.reshape.default(view_25, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del view_25
    t_9 = aten.t.default(blocks_1_attn_proj_weight)  # [128, 128] -> local [128, 128] (R, R)
    addmm_9 = aten.addmm.default(blocks_1_attn_proj_bias, view_26, t_9)  # [256, 128] -> local [256, 128] (R, R)
    del t_9
    view_27 = aten.reshape.default(addmm_9, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del addmm_9
    # blocks.1
    add_3 = aten.add.Tensor(add_2, view_27)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del view_27
    # blocks.1.ln2
    native_layer_norm_3 = aten.native_layer_norm.default(add_3, [128], blocks_1_ln2_weight, blocks_1_ln2_bias, 1e-05)  # -> (R, R), (R, R), (R, R)
    getitem_13 = native_layer_norm_3[0]  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    getitem_14 = native_layer_norm_3[1]  # [8, 32, 1] -> local [8, 32, 1] (R, R)
    getitem_15 = native_layer_norm_3[2]  # [8, 32, 1] -> local [8, 32, 1] (R, R)
    del native_layer_norm_3
    # blocks.1.fc
    view_28 = aten.reshape.default(getitem_13, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del getitem_13
    t_10 = aten.t.default(blocks_1_fc_weight)  # [128, 512] -> local [128, 512] (R, R)
    addmm_10 = aten.addmm.default(blocks_1_fc_bias, view_28, t_10)  # [256, 512] -> local [256, 512] (R, R)
    del t_10
    view_29 = aten.reshape.default(addmm_10, [8, 32, 512])  # [8, 32, 512] -> local [8, 32, 512] (R, R)
    del addmm_10
    # blocks.1
    gelu_1 = aten.gelu.default(view_29)  # [8, 32, 512] -> local [8, 32, 512] (R, R)
    # blocks.1.out
    view_30 = aten.reshape.default(gelu_1, [256, 512])  # [256, 512] -> local [256, 512] (R, R)
    del gelu_1
    t_11 = aten.t.default(blocks_1_out_weight)  # [512, 128] -> local [512, 128] (R, R)
    addmm_11 = aten.addmm.default(blocks_1_out_bias, view_30, t_11)  # [256, 128] -> local [256, 128] (R, R)
    del t_11
    view_31 = aten.reshape.default(addmm_11, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del addmm_11
    # blocks.1
    clone_1 = aten.clone.default(view_31)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del view_31
    add_4 = aten.add.Tensor(add_3, clone_1)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del clone_1
    # ln_f
    native_layer_norm_4 = aten.native_layer_norm.default(add_4, [128], ln_f_weight, ln_f_bias, 1e-05)  # -> (R, R), (R, R), (R, R)
    getitem_16 = native_layer_norm_4[0]  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    getitem_17 = native_layer_norm_4[1]  # [8, 32, 1] -> local [8, 32, 1] (R, R)
    getitem_18 = native_layer_norm_4[2]  # [8, 32, 1] -> local [8, 32, 1] (R, R)
    del native_layer_norm_4
    # head
    t_12 = aten.t.default(head_weight)  # [128, 256] -> local [128, 256] (R, R)
    view_32 = aten.reshape.default(getitem_16, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del getitem_16
    mm = aten.mm.default(view_32, t_12)  # [256, 256] -> local [256, 256] (R, R)
    del t_12
    _unsafe_view = aten.reshape.default(mm, [8, 32, 256])  # [8, 32, 256] -> local [8, 32, 256] (R, R)
    del mm
    # <model>
    view_33 = aten.reshape.default(_unsafe_view, [256, 256])  # [256, 256] -> local [256, 256] (R, R)
    del _unsafe_view
    view_34 = aten.reshape.default(targets, [256])  # [256] -> local [256] (R, R)
    _log_softmax = aten._log_softmax.default(view_33, 1, False)  # [256, 256] -> local [256, 256] (R, R)
    del view_33
    detach_2 = aten.detach.default(_log_softmax)  # [256, 256] -> local [256, 256] (R, R)
    nll_loss_forward_default = aten.nll_loss_forward.default(_log_softmax, view_34, None, 2, -100)  # -> (R, R), (R, R)
    getitem_42 = nll_loss_forward_default[0]  # [] -> local [] (R, R)
    getitem_43 = nll_loss_forward_default[1]  # [] -> local [] (R, R)
    del nll_loss_forward_default
    div_tensor = aten.div.Tensor(getitem_42, getitem_43)  # [] -> local [] (R, R)
    del getitem_42
    return (
        div_tensor,
        [
            arange, add, getitem_1, getitem_2, view, transpose, view_3, transpose_1, view_6, transpose_2, getitem_4, detach,
            view_10, add_1, getitem_6, getitem_7, view_12, view_13, view_14, add_2, getitem_9, getitem_10, view_16, transpose_4,
            view_19, transpose_5, view_22, transpose_6, getitem_12, detach_1, view_26, add_3, getitem_14, getitem_15, view_28,
            view_29, view_30, add_4, getitem_17, getitem_18, view_32, view_34, _log_softmax, detach_2, getitem_43, div_tensor,
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
        arange, add, getitem_1, getitem_2, view, transpose, view_3, transpose_1, view_6, transpose_2, getitem_4, detach,
        view_10, add_1, getitem_6, getitem_7, view_12, view_13, view_14, add_2, getitem_9, getitem_10, view_16, transpose_4,
        view_19, transpose_5, view_22, transpose_6, getitem_12, detach_1, view_26, add_3, getitem_14, getitem_15, view_28,
        view_29, view_30, add_4, getitem_17, getitem_18, view_32, view_34, _log_softmax, detach_2, getitem_43, div_tensor,
    ] = saved  # the values forward kept for backward
    saved.clear()  # held here alone now: each is freed after its last use

    # ---- backward ----
    # <model>
    ones_like_default = grad_loss  # d(loss)/d(loss): what autograd hands backward (1 for loss.backward())
    del div_tensor
    nll_loss_backward = aten.nll_loss_backward.default(ones_like_default, _log_softmax, view_34, None, 1, -100, getitem_43)  # [256, 256] -> local [256, 256] (R, R)
    del view_34, _log_softmax, getitem_43, ones_like_default
    detach_3 = aten.detach.default(detach_2)  # [256, 256] -> local [256, 256] (R, R)
    del detach_2
    _log_softmax_backward_data = aten._log_softmax_backward_data.default(nll_loss_backward, detach_3, 1, torch.float32)  # [256, 256] -> local [256, 256] (R, R)
    del nll_loss_backward, detach_3
    view_35 = aten.reshape.default(_log_softmax_backward_data, [8, 32, 256])  # [8, 32, 256] -> local [8, 32, 256] (R, R)
    del _log_softmax_backward_data
    view_36 = aten.reshape.default(view_35, [256, 256])  # [256, 256] -> local [256, 256] (R, R)
    del view_35
    t_13 = aten.t.default(view_36)  # [256, 256] -> local [256, 256] (R, R)
    # head
    grad_head_weight = aten.mm.default(t_13, view_32)  # [256, 128] -> local [256, 128] (R, R)
    del view_32, t_13
    mm_2 = aten.mm.default(view_36, head_weight)  # [256, 128] -> local [256, 128] (R, R)
    del view_36
    view_37 = aten.reshape.default(mm_2, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del mm_2
    # blocks.1
    native_layer_norm_backward = aten.native_layer_norm_backward.default(view_37, add_4, [128], getitem_17, getitem_18, ln_f_weight, ln_f_bias, [True, True, True])  # -> (R, R), (R, R), (R, R)
    del add_4, getitem_17, getitem_18, view_37
    getitem_21 = native_layer_norm_backward[0]  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    grad_ln_f_weight = native_layer_norm_backward[1]  # [128] -> local [128] (R, R)
    grad_ln_f_bias = native_layer_norm_backward[2]  # [128] -> local [128] (R, R)
    del native_layer_norm_backward
    view_38 = aten.reshape.default(getitem_21, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    # blocks.1.out
    mm_3 = aten.mm.default(view_38, blocks_1_out_weight)  # [256, 512] -> local [256, 512] (R, R)
    # blocks.1
    t_18 = aten.t.default(view_38)  # [128, 256] -> local [128, 256] (R, R)
    # blocks.1.out
    grad_blocks_1_out_weight = aten.mm.default(t_18, view_30)  # [128, 512] -> local [128, 512] (R, R)
    del view_30, t_18
    # blocks.1
    sum_1 = aten.sum.dim_IntList(view_38, [0], True)  # [1, 128] -> local [1, 128] (R, R)
    del view_38
    grad_blocks_1_out_bias = aten.reshape.default(sum_1, [128])  # [128] -> local [128] (R, R)
    del sum_1
    # blocks.1.out
    view_40 = aten.reshape.default(mm_3, [8, 32, 512])  # [8, 32, 512] -> local [8, 32, 512] (R, R)
    del mm_3
    # blocks.1.fc
    gelu_backward = aten.gelu_backward.default(view_40, view_29)  # [8, 32, 512] -> local [8, 32, 512] (R, R)
    del view_29, view_40
    view_41 = aten.reshape.default(gelu_backward, [256, 512])  # [256, 512] -> local [256, 512] (R, R)
    del gelu_backward
    mm_5 = aten.mm.default(view_41, blocks_1_fc_weight)  # [256, 128] -> local [256, 128] (R, R)
    t_22 = aten.t.default(view_41)  # [512, 256] -> local [512, 256] (R, R)
    grad_blocks_1_fc_weight = aten.mm.default(t_22, view_28)  # [512, 128] -> local [512, 128] (R, R)
    del view_28, t_22
    sum_2 = aten.sum.dim_IntList(view_41, [0], True)  # [1, 512] -> local [1, 512] (R, R)
    del view_41
    grad_blocks_1_fc_bias = aten.reshape.default(sum_2, [512])  # [512] -> local [512] (R, R)
    del sum_2
    view_43 = aten.reshape.default(mm_5, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del mm_5
    # blocks.1.ln2
    native_layer_norm_backward_1 = aten.native_layer_norm_backward.default(view_43, add_3, [128], getitem_14, getitem_15, blocks_1_ln2_weight, blocks_1_ln2_bias, [True, True, True])  # -> (R, R), (R, R), (R, R)
    del add_3, getitem_14, getitem_15, view_43
    getitem_24 = native_layer_norm_backward_1[0]  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    grad_blocks_1_ln2_weight = native_layer_norm_backward_1[1]  # [128] -> local [128] (R, R)
    grad_blocks_1_ln2_bias = native_layer_norm_backward_1[2]  # [128] -> local [128] (R, R)
    del native_layer_norm_backward_1
    add_5 = aten.add.Tensor(getitem_21, getitem_24)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del getitem_21, getitem_24
    view_44 = aten.reshape.default(add_5, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    # blocks.1.attn.proj
    mm_7 = aten.mm.default(view_44, blocks_1_attn_proj_weight)  # [256, 128] -> local [256, 128] (R, R)
    # blocks.1.ln2
    t_26 = aten.t.default(view_44)  # [128, 256] -> local [128, 256] (R, R)
    # blocks.1.attn.proj
    grad_blocks_1_attn_proj_weight = aten.mm.default(t_26, view_26)  # [128, 128] -> local [128, 128] (R, R)
    del view_26, t_26
    # blocks.1.ln2
    sum_3 = aten.sum.dim_IntList(view_44, [0], True)  # [1, 128] -> local [1, 128] (R, R)
    del view_44
    grad_blocks_1_attn_proj_bias = aten.reshape.default(sum_3, [128])  # [128] -> local [128] (R, R)
    del sum_3
    # blocks.1.attn.proj
    view_46 = aten.reshape.default(mm_7, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del mm_7
    view_47 = aten.reshape.default(view_46, [8, 32, 4, 32])  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del view_46
    transpose_8 = aten.transpose.int(view_47, 1, 2)  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    del view_47
    # blocks.1.attn
    detach_4 = aten.detach.default(detach_1)  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    del detach_1
    attention_backward = kernels.attention_backward(transpose_8, transpose_4, transpose_5, transpose_6, detach_4, getitem_12, 0.0, True)  # -> (R, R), (R, R), (R, R)
    del transpose_4, transpose_5, transpose_6, getitem_12, transpose_8, detach_4
    getitem_27 = attention_backward[0]  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    getitem_28 = attention_backward[1]  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    getitem_29 = attention_backward[2]  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    del attention_backward
    transpose_9 = aten.transpose.int(getitem_29, 1, 2)  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del getitem_29
    view_48 = aten.reshape.default(transpose_9, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del transpose_9
    view_49 = aten.reshape.default(view_48, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del view_48
    # blocks.1.attn.v
    mm_9 = aten.mm.default(view_49, blocks_1_attn_v_weight)  # [256, 128] -> local [256, 128] (R, R)
    # blocks.1.attn
    t_30 = aten.t.default(view_49)  # [128, 256] -> local [128, 256] (R, R)
    # blocks.1.attn.v
    grad_blocks_1_attn_v_weight = aten.mm.default(t_30, view_22)  # [128, 128] -> local [128, 128] (R, R)
    del view_22, t_30
    # blocks.1.attn
    sum_4 = aten.sum.dim_IntList(view_49, [0], True)  # [1, 128] -> local [1, 128] (R, R)
    del view_49
    grad_blocks_1_attn_v_bias = aten.reshape.default(sum_4, [128])  # [128] -> local [128] (R, R)
    del sum_4
    # blocks.1.attn.v
    view_51 = aten.reshape.default(mm_9, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del mm_9
    # blocks.1.attn
    transpose_10 = aten.transpose.int(getitem_28, 1, 2)  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del getitem_28
    view_52 = aten.reshape.default(transpose_10, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del transpose_10
    view_53 = aten.reshape.default(view_52, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del view_52
    # blocks.1.attn.k
    mm_11 = aten.mm.default(view_53, blocks_1_attn_k_weight)  # [256, 128] -> local [256, 128] (R, R)
    # blocks.1.attn
    t_34 = aten.t.default(view_53)  # [128, 256] -> local [128, 256] (R, R)
    # blocks.1.attn.k
    grad_blocks_1_attn_k_weight = aten.mm.default(t_34, view_19)  # [128, 128] -> local [128, 128] (R, R)
    del view_19, t_34
    # blocks.1.attn
    sum_5 = aten.sum.dim_IntList(view_53, [0], True)  # [1, 128] -> local [1, 128] (R, R)
    del view_53
    grad_blocks_1_attn_k_bias = aten.reshape.default(sum_5, [128])  # [128] -> local [128] (R, R)
    del sum_5
    # blocks.1.attn.k
    view_55 = aten.reshape.default(mm_11, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del mm_11
    # blocks.1.attn.v
    add_6 = aten.add.Tensor(view_51, view_55)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del view_51, view_55
    # blocks.1.attn
    transpose_11 = aten.transpose.int(getitem_27, 1, 2)  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del getitem_27
    view_56 = aten.reshape.default(transpose_11, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del transpose_11
    view_57 = aten.reshape.default(view_56, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del view_56
    # blocks.1.attn.q
    mm_13 = aten.mm.default(view_57, blocks_1_attn_q_weight)  # [256, 128] -> local [256, 128] (R, R)
    # blocks.1.attn
    t_38 = aten.t.default(view_57)  # [128, 256] -> local [128, 256] (R, R)
    # blocks.1.attn.q
    grad_blocks_1_attn_q_weight = aten.mm.default(t_38, view_16)  # [128, 128] -> local [128, 128] (R, R)
    del view_16, t_38
    # blocks.1.attn
    sum_6 = aten.sum.dim_IntList(view_57, [0], True)  # [1, 128] -> local [1, 128] (R, R)
    del view_57
    grad_blocks_1_attn_q_bias = aten.reshape.default(sum_6, [128])  # [128] -> local [128] (R, R)
    del sum_6
    # blocks.1.attn.q
    view_59 = aten.reshape.default(mm_13, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del mm_13
    # blocks.1.attn.v
    add_7 = aten.add.Tensor(add_6, view_59)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del add_6, view_59
    # blocks.1.ln1
    native_layer_norm_backward_2 = aten.native_layer_norm_backward.default(add_7, add_2, [128], getitem_9, getitem_10, blocks_1_ln1_weight, blocks_1_ln1_bias, [True, True, True])  # -> (R, R), (R, R), (R, R)
    del add_2, getitem_9, getitem_10, add_7
    getitem_30 = native_layer_norm_backward_2[0]  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    grad_blocks_1_ln1_weight = native_layer_norm_backward_2[1]  # [128] -> local [128] (R, R)
    grad_blocks_1_ln1_bias = native_layer_norm_backward_2[2]  # [128] -> local [128] (R, R)
    del native_layer_norm_backward_2
    # blocks.1.ln2
    add_8 = aten.add.Tensor(add_5, getitem_30)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del add_5, getitem_30
    view_60 = aten.reshape.default(add_8, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    # blocks.0.out
    mm_15 = aten.mm.default(view_60, blocks_0_out_weight)  # [256, 512] -> local [256, 512] (R, R)
    # blocks.1.ln2
    t_42 = aten.t.default(view_60)  # [128, 256] -> local [128, 256] (R, R)
    # blocks.0.out
    grad_blocks_0_out_weight = aten.mm.default(t_42, view_14)  # [128, 512] -> local [128, 512] (R, R)
    del view_14, t_42
    # blocks.1.ln2
    sum_7 = aten.sum.dim_IntList(view_60, [0], True)  # [1, 128] -> local [1, 128] (R, R)
    del view_60
    grad_blocks_0_out_bias = aten.reshape.default(sum_7, [128])  # [128] -> local [128] (R, R)
    del sum_7
    # blocks.0.out
    view_62 = aten.reshape.default(mm_15, [8, 32, 512])  # [8, 32, 512] -> local [8, 32, 512] (R, R)
    del mm_15
    # blocks.0.fc
    gelu_backward_1 = aten.gelu_backward.default(view_62, view_13)  # [8, 32, 512] -> local [8, 32, 512] (R, R)
    del view_13, view_62
    view_63 = aten.reshape.default(gelu_backward_1, [256, 512])  # [256, 512] -> local [256, 512] (R, R)
    del gelu_backward_1
    mm_17 = aten.mm.default(view_63, blocks_0_fc_weight)  # [256, 128] -> local [256, 128] (R, R)
    t_46 = aten.t.default(view_63)  # [512, 256] -> local [512, 256] (R, R)
    grad_blocks_0_fc_weight = aten.mm.default(t_46, view_12)  # [512, 128] -> local [512, 128] (R, R)
    del view_12, t_46
    sum_8 = aten.sum.dim_IntList(view_63, [0], True)  # [1, 512] -> local [1, 512] (R, R)
    del view_63
    grad_blocks_0_fc_bias = aten.reshape.default(sum_8, [512])  # [512] -> local [512] (R, R)
    del sum_8
    view_65 = aten.reshape.default(mm_17, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del mm_17
    # blocks.0.ln2
    native_layer_norm_backward_3 = aten.native_layer_norm_backward.default(view_65, add_1, [128], getitem_6, getitem_7, blocks_0_ln2_weight, blocks_0_ln2_bias, [True, True, True])  # -> (R, R), (R, R), (R, R)
    del add_1, getitem_6, getitem_7, view_65
    getitem_33 = native_layer_norm_backward_3[0]  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    grad_blocks_0_ln2_weight = native_layer_norm_backward_3[1]  # [128] -> local [128] (R, R)
    grad_blocks_0_ln2_bias = native_layer_norm_backward_3[2]  # [128] -> local [128] (R, R)
    del native_layer_norm_backward_3
    # blocks.1.ln2
    add_9 = aten.add.Tensor(add_8, getitem_33)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del add_8, getitem_33
    view_66 = aten.reshape.default(add_9, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    # blocks.0.attn.proj
    mm_19 = aten.mm.default(view_66, blocks_0_attn_proj_weight)  # [256, 128] -> local [256, 128] (R, R)
    # blocks.1.ln2
    t_50 = aten.t.default(view_66)  # [128, 256] -> local [128, 256] (R, R)
    # blocks.0.attn.proj
    grad_blocks_0_attn_proj_weight = aten.mm.default(t_50, view_10)  # [128, 128] -> local [128, 128] (R, R)
    del view_10, t_50
    # blocks.1.ln2
    sum_9 = aten.sum.dim_IntList(view_66, [0], True)  # [1, 128] -> local [1, 128] (R, R)
    del view_66
    grad_blocks_0_attn_proj_bias = aten.reshape.default(sum_9, [128])  # [128] -> local [128] (R, R)
    del sum_9
    # blocks.0.attn.proj
    view_68 = aten.reshape.default(mm_19, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del mm_19
    view_69 = aten.reshape.default(view_68, [8, 32, 4, 32])  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del view_68
    transpose_12 = aten.transpose.int(view_69, 1, 2)  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    del view_69
    # blocks.0.attn
    detach_5 = aten.detach.default(detach)  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    del detach
    attention_backward_1 = kernels.attention_backward(transpose_12, transpose, transpose_1, transpose_2, detach_5, getitem_4, 0.0, True)  # -> (R, R), (R, R), (R, R)
    del transpose, transpose_1, transpose_2, getitem_4, transpose_12, detach_5
    getitem_36 = attention_backward_1[0]  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    getitem_37 = attention_backward_1[1]  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    getitem_38 = attention_backward_1[2]  # [8, 4, 32, 32] -> local [8, 4, 32, 32] (R, R)
    del attention_backward_1
    transpose_13 = aten.transpose.int(getitem_38, 1, 2)  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del getitem_38
    view_70 = aten.reshape.default(transpose_13, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del transpose_13
    view_71 = aten.reshape.default(view_70, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del view_70
    # blocks.0.attn.v
    mm_21 = aten.mm.default(view_71, blocks_0_attn_v_weight)  # [256, 128] -> local [256, 128] (R, R)
    # blocks.0.attn
    t_54 = aten.t.default(view_71)  # [128, 256] -> local [128, 256] (R, R)
    # blocks.0.attn.v
    grad_blocks_0_attn_v_weight = aten.mm.default(t_54, view_6)  # [128, 128] -> local [128, 128] (R, R)
    del view_6, t_54
    # blocks.0.attn
    sum_10 = aten.sum.dim_IntList(view_71, [0], True)  # [1, 128] -> local [1, 128] (R, R)
    del view_71
    grad_blocks_0_attn_v_bias = aten.reshape.default(sum_10, [128])  # [128] -> local [128] (R, R)
    del sum_10
    # blocks.0.attn.v
    view_73 = aten.reshape.default(mm_21, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del mm_21
    # blocks.0.attn
    transpose_14 = aten.transpose.int(getitem_37, 1, 2)  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del getitem_37
    view_74 = aten.reshape.default(transpose_14, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del transpose_14
    view_75 = aten.reshape.default(view_74, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del view_74
    # blocks.0.attn.k
    mm_23 = aten.mm.default(view_75, blocks_0_attn_k_weight)  # [256, 128] -> local [256, 128] (R, R)
    # blocks.0.attn
    t_58 = aten.t.default(view_75)  # [128, 256] -> local [128, 256] (R, R)
    # blocks.0.attn.k
    grad_blocks_0_attn_k_weight = aten.mm.default(t_58, view_3)  # [128, 128] -> local [128, 128] (R, R)
    del view_3, t_58
    # blocks.0.attn
    sum_11 = aten.sum.dim_IntList(view_75, [0], True)  # [1, 128] -> local [1, 128] (R, R)
    del view_75
    grad_blocks_0_attn_k_bias = aten.reshape.default(sum_11, [128])  # [128] -> local [128] (R, R)
    del sum_11
    # blocks.0.attn.k
    view_77 = aten.reshape.default(mm_23, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del mm_23
    # blocks.0.attn.v
    add_10 = aten.add.Tensor(view_73, view_77)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del view_73, view_77
    # blocks.0.attn
    transpose_15 = aten.transpose.int(getitem_36, 1, 2)  # [8, 32, 4, 32] -> local [8, 32, 4, 32] (R, R)
    del getitem_36
    view_78 = aten.reshape.default(transpose_15, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del transpose_15
    view_79 = aten.reshape.default(view_78, [256, 128])  # [256, 128] -> local [256, 128] (R, R)
    del view_78
    # blocks.0.attn.q
    mm_25 = aten.mm.default(view_79, blocks_0_attn_q_weight)  # [256, 128] -> local [256, 128] (R, R)
    # blocks.0.attn
    t_62 = aten.t.default(view_79)  # [128, 256] -> local [128, 256] (R, R)
    # blocks.0.attn.q
    grad_blocks_0_attn_q_weight = aten.mm.default(t_62, view)  # [128, 128] -> local [128, 128] (R, R)
    del view, t_62
    # blocks.0.attn
    sum_12 = aten.sum.dim_IntList(view_79, [0], True)  # [1, 128] -> local [1, 128] (R, R)
    del view_79
    grad_blocks_0_attn_q_bias = aten.reshape.default(sum_12, [128])  # [128] -> local [128] (R, R)
    del sum_12
    # blocks.0.attn.q
    view_81 = aten.reshape.default(mm_25, [8, 32, 128])  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del mm_25
    # blocks.0.attn.v
    add_11 = aten.add.Tensor(add_10, view_81)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del add_10, view_81
    # blocks.0.ln1
    native_layer_norm_backward_4 = aten.native_layer_norm_backward.default(add_11, add, [128], getitem_1, getitem_2, blocks_0_ln1_weight, blocks_0_ln1_bias, [True, True, True])  # -> (R, R), (R, R), (R, R)
    del add, getitem_1, getitem_2, add_11
    getitem_39 = native_layer_norm_backward_4[0]  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    grad_blocks_0_ln1_weight = native_layer_norm_backward_4[1]  # [128] -> local [128] (R, R)
    grad_blocks_0_ln1_bias = native_layer_norm_backward_4[2]  # [128] -> local [128] (R, R)
    del native_layer_norm_backward_4
    # blocks.1.ln2
    add_12 = aten.add.Tensor(add_9, getitem_39)  # [8, 32, 128] -> local [8, 32, 128] (R, R)
    del add_9, getitem_39
    sum_13 = aten.sum.dim_IntList(add_12, [0], True)  # [1, 32, 128] -> local [1, 32, 128] (R, R)
    view_82 = aten.reshape.default(sum_13, [32, 128])  # [32, 128] -> local [32, 128] (R, R)
    del sum_13
    # <model>
    grad_wpe_weight = aten.embedding_dense_backward.default(view_82, arange, 32, -1, False)  # [32, 128] -> local [32, 128] (R, R)
    del arange, view_82
    # blocks.1.ln2
    grad_wte_weight = aten.embedding_dense_backward.default(add_12, idx, 256, -1, False)  # [256, 128] -> local [256, 128] (R, R)
    del add_12
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
    return {
        'wte.weight': accumulate(grad_wte_weight, unsynced, 'wte.weight'),
        'wpe.weight': accumulate(grad_wpe_weight, unsynced, 'wpe.weight'),
        'blocks.0.ln1.weight': accumulate(grad_blocks_0_ln1_weight, unsynced, 'blocks.0.ln1.weight'),
        'blocks.0.ln1.bias': accumulate(grad_blocks_0_ln1_bias, unsynced, 'blocks.0.ln1.bias'),
        'blocks.0.attn.q.weight': accumulate(grad_blocks_0_attn_q_weight, unsynced, 'blocks.0.attn.q.weight'),
        'blocks.0.attn.q.bias': accumulate(grad_blocks_0_attn_q_bias, unsynced, 'blocks.0.attn.q.bias'),
        'blocks.0.attn.k.weight': accumulate(grad_blocks_0_attn_k_weight, unsynced, 'blocks.0.attn.k.weight'),
        'blocks.0.attn.k.bias': accumulate(grad_blocks_0_attn_k_bias, unsynced, 'blocks.0.attn.k.bias'),
        'blocks.0.attn.v.weight': accumulate(grad_blocks_0_attn_v_weight, unsynced, 'blocks.0.attn.v.weight'),
        'blocks.0.attn.v.bias': accumulate(grad_blocks_0_attn_v_bias, unsynced, 'blocks.0.attn.v.bias'),
        'blocks.0.attn.proj.weight': accumulate(grad_blocks_0_attn_proj_weight, unsynced, 'blocks.0.attn.proj.weight'),
        'blocks.0.attn.proj.bias': accumulate(grad_blocks_0_attn_proj_bias, unsynced, 'blocks.0.attn.proj.bias'),
        'blocks.0.ln2.weight': accumulate(grad_blocks_0_ln2_weight, unsynced, 'blocks.0.ln2.weight'),
        'blocks.0.ln2.bias': accumulate(grad_blocks_0_ln2_bias, unsynced, 'blocks.0.ln2.bias'),
        'blocks.0.fc.weight': accumulate(grad_blocks_0_fc_weight, unsynced, 'blocks.0.fc.weight'),
        'blocks.0.fc.bias': accumulate(grad_blocks_0_fc_bias, unsynced, 'blocks.0.fc.bias'),
        'blocks.0.out.weight': accumulate(grad_blocks_0_out_weight, unsynced, 'blocks.0.out.weight'),
        'blocks.0.out.bias': accumulate(grad_blocks_0_out_bias, unsynced, 'blocks.0.out.bias'),
        'blocks.1.ln1.weight': accumulate(grad_blocks_1_ln1_weight, unsynced, 'blocks.1.ln1.weight'),
        'blocks.1.ln1.bias': accumulate(grad_blocks_1_ln1_bias, unsynced, 'blocks.1.ln1.bias'),
        'blocks.1.attn.q.weight': accumulate(grad_blocks_1_attn_q_weight, unsynced, 'blocks.1.attn.q.weight'),
        'blocks.1.attn.q.bias': accumulate(grad_blocks_1_attn_q_bias, unsynced, 'blocks.1.attn.q.bias'),
        'blocks.1.attn.k.weight': accumulate(grad_blocks_1_attn_k_weight, unsynced, 'blocks.1.attn.k.weight'),
        'blocks.1.attn.k.bias': accumulate(grad_blocks_1_attn_k_bias, unsynced, 'blocks.1.attn.k.bias'),
        'blocks.1.attn.v.weight': accumulate(grad_blocks_1_attn_v_weight, unsynced, 'blocks.1.attn.v.weight'),
        'blocks.1.attn.v.bias': accumulate(grad_blocks_1_attn_v_bias, unsynced, 'blocks.1.attn.v.bias'),
        'blocks.1.attn.proj.weight': accumulate(grad_blocks_1_attn_proj_weight, unsynced, 'blocks.1.attn.proj.weight'),
        'blocks.1.attn.proj.bias': accumulate(grad_blocks_1_attn_proj_bias, unsynced, 'blocks.1.attn.proj.bias'),
        'blocks.1.ln2.weight': accumulate(grad_blocks_1_ln2_weight, unsynced, 'blocks.1.ln2.weight'),
        'blocks.1.ln2.bias': accumulate(grad_blocks_1_ln2_bias, unsynced, 'blocks.1.ln2.bias'),
        'blocks.1.fc.weight': accumulate(grad_blocks_1_fc_weight, unsynced, 'blocks.1.fc.weight'),
        'blocks.1.fc.bias': accumulate(grad_blocks_1_fc_bias, unsynced, 'blocks.1.fc.bias'),
        'blocks.1.out.weight': accumulate(grad_blocks_1_out_weight, unsynced, 'blocks.1.out.weight'),
        'blocks.1.out.bias': accumulate(grad_blocks_1_out_bias, unsynced, 'blocks.1.out.bias'),
        'ln_f.weight': accumulate(grad_ln_f_weight, unsynced, 'ln_f.weight'),
        'ln_f.bias': accumulate(grad_ln_f_bias, unsynced, 'ln_f.bias'),
        'head.weight': accumulate(grad_head_weight, unsynced, 'head.weight'),
    }


def accumulate(grad, unsynced, name):
    """``grad`` plus the local gradient of ``name`` that earlier micro-batches left unsynced (no_sync)."""
    earlier = unsynced.pop(name, None)
    return grad if earlier is None else grad + earlier
