"""Small Hugging Face transformers models (random init, nothing downloaded), each
wrapped so that ``forward(*inputs)`` returns the scalar training loss."""
from __future__ import annotations

import torch
from torch import nn


class LossOf(nn.Module):
    """``forward(inputs, labels)`` -> the Hugging Face model's loss; ``input_name`` says what the inputs are."""

    def __init__(self, model, input_name: str = "input_ids"):
        super().__init__()
        self.model = model
        self.input_name = input_name

    def forward(self, inputs, labels):
        return self.model(**{self.input_name: inputs, "labels": labels}).loss


def _text_inputs(batch, seq, vocab, masked=False):
    ids = torch.randint(0, vocab, (batch, seq))
    labels = ids.clone()
    if masked and ids.device.type != "meta":  # masked LM: only ~15% of positions carry a label
        labels[torch.rand(batch, seq) > 0.15] = -100
    return ids, labels


def gpt2(batch=4, seq=32, width=64, heads=4, layers=2, vocab=256, dropout=0.0):
    """GPT-2; ``dropout`` on the embeddings, the attention probabilities and the residuals
    (Hugging Face's default is 0.1)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=seq,
                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    return LossOf(GPT2LMHeadModel(cfg)), _text_inputs(batch, seq, vocab)


def llama(batch=4, seq=32, width=64, heads=4, kv_heads=2, layers=2, vocab=256):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                      max_position_embeddings=seq)
    return LossOf(LlamaForCausalLM(cfg)), _text_inputs(batch, seq, vocab)


def mistral(batch=4, seq=32, width=64, heads=4, kv_heads=2, layers=2, vocab=256):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                        max_position_embeddings=seq, sliding_window=seq)
    return LossOf(MistralForCausalLM(cfg)), _text_inputs(batch, seq, vocab)


def mixtral(batch=4, seq=32, width=64, heads=4, kv_heads=2, layers=2, vocab=256, experts=4, intermediate=None):
    """``intermediate``: each expert's hidden size (default 2 * width; Mixtral-8x7B: 14336 at 4096)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(hidden_size=width, intermediate_size=intermediate or 2 * width, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                        max_position_embeddings=seq, num_local_experts=experts, num_experts_per_tok=2)
    return LossOf(MixtralForCausalLM(cfg)), _text_inputs(batch, seq, vocab)


def qwen2_moe(batch=4, seq=32, width=64, heads=4, kv_heads=2, layers=2, vocab=256, experts=4):
    """Qwen2-MoE: routed experts beside a shared expert whose output a sigmoid gate scales."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = Qwen2MoeConfig(hidden_size=width, intermediate_size=2 * width, moe_intermediate_size=width,
                         shared_expert_intermediate_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, vocab_size=vocab, max_position_embeddings=seq,
                         num_experts=experts, num_experts_per_tok=2, decoder_sparse_step=1)
    return LossOf(Qwen2MoeForCausalLM(cfg)), _text_inputs(batch, seq, vocab)


def deepseek_v3(batch=4, seq=32, width=64, heads=4, layers=2, vocab=256, experts=4):
    """DeepSeek-V3 in miniature: latent attention, a dense first layer, then routed experts
    (grouped top-k with a routing bias) beside a shared expert."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(hidden_size=width, intermediate_size=2 * width, moe_intermediate_size=width,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                           vocab_size=vocab, max_position_embeddings=seq, n_routed_experts=experts,
                           num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
                           first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                           qk_nope_head_dim=8, v_head_dim=16)
    return LossOf(DeepseekV3ForCausalLM(cfg)), _text_inputs(batch, seq, vocab)


def bert(batch=4, seq=32, width=64, heads=4, layers=2, vocab=256):
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=4 * width, vocab_size=vocab, max_position_embeddings=seq,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return LossOf(BertForMaskedLM(cfg)), _text_inputs(batch, seq, vocab, masked=True)


def vit(batch=4, image=32, patch=8, width=64, heads=4, layers=2, classes=10):
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=image, patch_size=patch, hidden_size=width, num_hidden_layers=layers,
                    num_attention_heads=heads, intermediate_size=4 * width, num_labels=classes,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return LossOf(ViTForImageClassification(cfg), "pixel_values"), (torch.randn(batch, 3, image, image),
                                                             torch.randint(0, classes, (batch,)))


def bloom(batch=4, seq=32, width=64, heads=4, layers=2, vocab=256):
    """BLOOM: ALiBi attention, whose scores come from baddbmm and whose bias repeat()s per head."""
    from transformers import BloomConfig, BloomForCausalLM

    cfg = BloomConfig(hidden_size=width, n_layer=layers, n_head=heads, vocab_size=vocab, hidden_dropout=0.0,
                      attention_dropout=0.0)
    return LossOf(BloomForCausalLM(cfg)), _text_inputs(batch, seq, vocab)


def convnext(batch=4, image=32, width=64, layers=2, classes=10):
    """ConvNeXt: depthwise 7x7 convolutions (groups = channels) between pointwise layers."""
    from transformers import ConvNextConfig, ConvNextForImageClassification

    cfg = ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[width, 2 * width], depths=[layers, layers],
                         num_labels=classes, patch_size=4, image_size=image)
    return LossOf(ConvNextForImageClassification(cfg), "pixel_values"), (torch.randn(batch, 3, image, image),
                                                                         torch.randint(0, classes, (batch,)))


def sizes(name: str, width: int = 1024, seq: int = 512, batch: int = 8) -> dict:
    """Keyword sizes for ``make`` at which sharding pays on GPUs (plan these on the meta device)."""
    heads = max(8, width // 64)
    if name == "vit":
        return {"batch": batch, "width": width, "heads": heads, "image": 224, "patch": 16}
    if name == "convnext":
        return {"batch": batch, "width": width // 4, "image": 224}
    if name == "bloom":
        return {"batch": batch, "seq": seq, "width": width, "heads": heads, "vocab": 32000}
    common = {"batch": batch, "seq": seq, "width": width, "heads": heads, "vocab": 32000}
    if name in ("llama", "mistral", "mixtral"):
        common["kv_heads"] = heads // 4
    return common


ZOO = {"gpt2": gpt2, "llama": llama, "mistral": mistral, "bert": bert, "mixtral": mixtral, "vit": vit}
# beyond the tests' zoo: architectures whose ops once fell back to replication (benchmarks/zoo.py)
MORE = {"bloom": bloom, "convnext": convnext}


def make(name: str, seed: int = 0, **sizes):
    torch.manual_seed(seed)
    return {**ZOO, **MORE}[name](**sizes)


# Llama 3's published shapes: (layers, width, MLP width, heads, key-value heads); vocabulary 128256
LLAMA3 = {"8b": (32, 4096, 14336, 32, 8), "70b": (80, 8192, 28672, 64, 8)}


def llama3_shaped(size: str, batch: int, seq: int, layers: int | None = None):
    """A Llama-3-``size``-shaped model in bf16 on the meta device (planned, never run) with
    ``batch`` sequences of ``seq`` tokens; ``layers`` fewer than the model's keeps a plan fast."""
    from transformers import LlamaConfig, LlamaForCausalLM

    depth, width, mlp, heads, kv_heads = LLAMA3[size]
    cfg = LlamaConfig(hidden_size=width, intermediate_size=mlp, num_hidden_layers=layers or depth,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=128256,
                      max_position_embeddings=seq)
    with torch.device("meta"):
        model = LossOf(LlamaForCausalLM(cfg)).to(torch.bfloat16)
        ids = torch.empty(batch, seq, dtype=torch.long)
    return model, (ids, ids)
