"""An independent float64 reference of one MoE layer of a Hugging Face checkpoint.

Written from the models' published semantics (../../../shared/MODELS.md, transformers'
modeling code), not from libmoe's sources, and using only numpy and the safetensors package:

  router_logits = x Wr^T                                  float64
  probs         = softmax(router_logits)                  float64
  topk_ids      = the K largest probs, score descending, ties to the lower expert id
  topk_weights  = probs[topk_ids], divided by (sum + 1e-20) when the family renormalizes
                  (Mixtral always; Qwen2/3-MoE when config norm_topk_prob)
  y_e(x)        = W_down (silu(W_gate x) * (W_up x)),   silu(v) = v / (1 + exp(-v))
  output        = sum_k topk_weights[k] * y_{topk_ids[k]}(x)
                  (+ sigmoid(w_sg . x) * y_shared(x) for Qwen2-MoE's gated shared expert)

The other families, from transformers 5.24's modeling code (the routing table of MODELS.md):

  DeepSeek-V2   softmax; topk_method greedy, or group_limited_greedy (groups of E/n_group,
                group score = max, keep topk_group groups, the rest masked); no
                renormalization; routed_scaling_factor; n_shared_experts * I shared, ungated
  DeepSeek-V3   s = sigmoid(l); choice = s + e_score_correction_bias; group score = sum of
                the two best choices; keep topk_group groups (others -inf); top-k on choice;
                weights = s (unbiased), / (sum + 1e-20) if norm_topk_prob; * scale; shared
  gpt-oss       l = x Wr^T + b; top-k on l; weights = softmax of the k; experts: gu = x W + b
                (gate = even columns, up = odd), gate = min(gate, limit), up = clamp(up,
                -limit, limit), h = (up + 1) * gate * sigmoid(alpha gate), y = h Wd + bd
  Llama-4       top-k on l; w = sigmoid(l); y = SwiGLU(w x), summed unweighted; + shared(x)
  OLMoE         softmax, renormalize if norm_topk_prob
  Granite-MoE   top-k on l, softmax of the k
  Qwen3.5-MoE   softmax, always renormalized, sigmoid-gated shared expert
  Qwen3-Next    as Qwen2-MoE with norm_topk_prob defaulting to true
  Laguna        s = sigmoid(l); top-k on s + e_score_correction_bias (saved as
                experts.e_score_correction_bias); w = s / sum (always); * moe_routed_scaling_factor;
                + shared_expert(x), ungated
  Kolibri1      top-k on l + the bias (saved as model.layers.L.moe.router.expert_bias);
                w = sigmoid(l), / sum if norm_topk_prob (false); + shared_experts(x), ungated
  Beam          DeepSeek-V3's router (BeamConfig: 8 groups keep 4, norm true, scale 2.5), no
                shared expert; MoE layers by mlp_layer_types (absent: layer >= 3)
  MiniMax-M3    text_config; s = sigmoid(l); top-k on s + e_score_correction_bias (beside the
                gate, as released); w = s / sum (always); * routed_scaling_factor (2); routed and
                shared experts (shared_intermediate_size) with gpt-oss's clamped SwiGLU on
                gate / up halves; released under language_model.model.layers.L.block_sparse_moe.
                with w1 / w3 / w2; MoE layers by mlp_layer_types (absent: every layer)
  AFMoE         s = sigmoid(l) (router.gate); top-k on s + expert_bias; w = s / (sum + 1e-20)
                * route_scale; + num_shared_experts * I shared, ungated; layer >= num_dense_layers
  Flint         s = sigmoid(l); top-k on s; / sum if norm_topk_prob (true); + shared_expert(x);
                MoE layers as Qwen2-MoE's with mlp_only_layers defaulting to [0, 1]
  Lara-Mini     softmax, / sum if norm_topk_prob (true); + shared_expert(x), ungated
  Granite-MoE-SWA  Granite-MoE's block (router.weight, stacked experts); its shared_mlp is
                outside the block (refused here when shared_intermediate_size > 0)
  Qwen4-Exp     text_config; softmax, / sum if norm_topk_prob (true); sigmoid-gated
                shared_expert; model.language_model. prefix
  Privacy filter gpt-oss's block (OpenAIPrivacyFilterMLP) with gate/up (and their biases) as
                halves of gate_up_proj [E, H, 2I]; its / top_k and * top_k cancel
  JetMoE        as Granite-MoE (top-k on l, softmax of the k; input_linear / output_linear),
                activation from activation_function, plus the block's bias [H] on the output
  Phi-MoE       sparsemixer (eval): two rounds of "largest remaining logit m, mask every
                expert with (m - l) / max(|l|, m) > 2 router_jitter_noise, weight = softmax
                of the unmasked logits at the pick"; no renormalization; Mixtral's experts
  Granite-MoE-Shared, Granite-MoE-Hybrid (Granite 4.0)
                Granite-MoE's router and experts, plus the decoder layer's shared_mlp on the same
                input: model.layers.L.shared_mlp.input_linear [2 I_s, H] (act(first half) * second
                half), output_linear [H, I_s]; I_s = shared_intermediate_size (absent: 0 / 1024)
  Hunyuan-MoE   softmax, top-k (config moe_topk, maybe a per-layer list), always renormalized;
                router gate.wg; + shared_mlp (ungated, intermediate_size wide)
  Mellum        Qwen3-MoE's router (norm_topk_prob default true); MoE where mlp_layer_types[L]
                is "sparse" (absent: every layer)
  Jamba         softmax, top-k, not renormalized; router feed_forward.router; MoE where
                L % expert_layer_period (2) == expert_layer_offset (1) and num_experts > 1
  Mistral-4     s = softmax(l); groups: score = sum of the two best s, keep topk_group (others
                0); top-k on s; weights s, / (sum + 1e-20) if norm_topk_prob (true); *
                routed_scaling_factor (1); n_shared_experts (1) * I shared; L >= first_k_dense_replace
  Aria          top-k on l, softmax of the k (AriaTextTopKRouter); input-major experts.fc1
                [E, H, 2I] (gate = first I columns) and experts.fc2 [E, I, H]; + shared_experts
                (moe_num_shared_experts (2) * I); K = moe_topk, E = moe_num_experts
  ERNIE-4.5-MoE s = softmax(l); top-k on s + moe_statics.e_score_correction_bias [1, E]; weights
                s / max(sum, moe_norm_min); moe_num_shared_experts (2) * I shared; K = moe_k;
                MoE where (L + 1) % moe_layer_interval == 0, start_index <= L <= end_index
  Qwen3-Omni    the thinker's text MoE: Qwen3-MoE's router, norm_topk_prob defaulting to true;
                fields in config thinker_config.text_config (the thinker alone: text_config)

Weights of any dtype (F32, BF16, F16) are widened exactly to float64, so the reference uses
the same rounded weights a bf16/f16 implementation sees. Tensor names: per-expert (what
transformers' save_pretrained writes), stacked (transformers' in-memory layout,
experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I]; Granite input_linear /
output_linear), and the input-major [E, H, 2I] / [E, I, H] of Llama-4 and gpt-oss.
gpt-oss's MXFP4 experts (config quantization_config quant_method mxfp4; transformers'
integrations/mxfp4.py) are dequantized exactly to float64 (mxfp4_dequant):
experts.gate_up_proj_blocks [E, 2I, H/32, 16] U8 + _scales [E, 2I, H/32] U8 give the
output-major [E, 2I, H], gate = even rows, up = odd rows (the bf16 layout's columns);
experts.down_proj_blocks / _scales give [E, H, I].
"""

import json
import math
import os

import numpy as np
import safetensors

# safetensors dtype code -> (numpy storage dtype, widening function to float64)
_F64 = {
    "F64": (np.float64, lambda a: a.astype(np.float64)),
    "F32": (np.float32, lambda a: a.astype(np.float64)),
    "F16": (np.float16, lambda a: a.astype(np.float64)),
    "BF16": (np.uint16, lambda a: (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)),
    "I64": (np.int64, lambda a: a),
    "I32": (np.int32, lambda a: a),
    "U8": (np.uint8, lambda a: a),
}


def read_safetensors(path):
    """{name: (dtype_code, ndarray)}: float tensors widened exactly to float64, ints as is."""
    with open(path, "rb") as fh:
        raw = fh.read()
    out = {}
    for name, t in safetensors.deserialize(raw):
        code = t["dtype"]
        if code not in _F64:
            raise ValueError(f"{path}: tensor {name}: dtype {code} not handled by ref64")
        store, widen = _F64[code]
        a = np.frombuffer(bytes(t["data"]), dtype=np.dtype(store).newbyteorder("<"))
        out[name] = (code, widen(a).reshape(t["shape"]))
    return out


class Checkpoint:
    """A Hugging Face folder: config.json + model.safetensors, or the shards listed in
    model.safetensors.index.json."""

    def __init__(self, d):
        self.dir = d
        with open(os.path.join(d, "config.json")) as fh:
            self.config = json.load(fh)
        idx = os.path.join(d, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as fh:
                files = sorted(set(json.load(fh)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self.tensors = {}
        self.dtypes = {}
        for fn in files:
            for name, (code, arr) in read_safetensors(os.path.join(d, fn)).items():
                if name in self.tensors:
                    raise ValueError(f"{d}: tensor {name} appears in two files")
                self.tensors[name] = arr
                self.dtypes[name] = code
        self.family = family_of(self.config)

    def get(self, name):
        if name not in self.tensors:
            raise KeyError(f"{self.dir}: tensor {name} not found")
        return self.tensors[name]

    def has(self, name):
        return name in self.tensors


_FAMILIES = {
    "MixtralForCausalLM": "mixtral", "mixtral": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe", "qwen2_moe": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe", "qwen3_moe": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2", "deepseek_v2": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3", "deepseek_v3": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss", "gpt_oss": "gpt_oss",
    "Llama4ForConditionalGeneration": "llama4", "llama4": "llama4",
    "Llama4ForCausalLM": "llama4", "llama4_text": "llama4",
    "OlmoeForCausalLM": "olmoe", "olmoe": "olmoe",
    "GraniteMoeForCausalLM": "granitemoe", "granitemoe": "granitemoe",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe", "qwen3_5_moe": "qwen3_5_moe",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe", "qwen3_5_moe_text": "qwen3_5_moe",
    "Qwen3NextForCausalLM": "qwen3_next", "qwen3_next": "qwen3_next",
    "Glm4MoeForCausalLM": "glm4_moe", "glm4_moe": "glm4_moe",
    "Dots1ForCausalLM": "dots1", "dots1": "dots1",
    "MiniMaxForCausalLM": "minimax", "minimax": "minimax",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe", "qwen3_vl_moe": "qwen3_vl_moe",
    "FlexOlmoForCausalLM": "flex_olmo", "flex_olmo": "flex_olmo",
    "Glm4MoeLiteForCausalLM": "glm4_moe_lite", "glm4_moe_lite": "glm4_moe_lite",
    "DeepseekV32ForCausalLM": "deepseek_v32", "deepseek_v32": "deepseek_v32",
    "ExaoneMoeForCausalLM": "exaone_moe", "exaone_moe": "exaone_moe",
    "MiMoV2FlashForCausalLM": "mimo_v2_flash", "mimo_v2_flash": "mimo_v2_flash",
    "LagunaForCausalLM": "laguna", "laguna": "laguna",
    "Kolibri1ForCausalLM": "kolibri1", "kolibri1": "kolibri1",
    "BeamForCausalLM": "beam", "beam": "beam",
    "AfmoeForCausalLM": "afmoe", "afmoe": "afmoe",
    "FlintForCausalLM": "flint", "flint": "flint",
    "LaraMiniForCausalLM": "lara_mini", "lara_mini": "lara_mini",
    "GraniteMoeSWAForCausalLM": "granitemoe_swa", "granitemoe_swa": "granitemoe_swa",
    "MiniMaxM3SparseForConditionalGeneration": "minimax_m3_vl", "minimax_m3_vl": "minimax_m3_vl",
    "Qwen4ExpForConditionalGeneration": "qwen4_exp", "qwen4_exp": "qwen4_exp",
    "Qwen4ExpForCausalLM": "qwen4_exp", "qwen4_exp_text": "qwen4_exp",
    "PhimoeForCausalLM": "phimoe", "phimoe": "phimoe",
    "JetMoeForCausalLM": "jetmoe", "jetmoe": "jetmoe",
    "OpenAIPrivacyFilterForTokenClassification": "openai_privacy_filter",
    "openai_privacy_filter": "openai_privacy_filter",
    "Qwen3OmniMoeForConditionalGeneration": "qwen3_omni_moe", "qwen3_omni_moe": "qwen3_omni_moe",
    "Qwen3OmniMoeThinkerForConditionalGeneration": "qwen3_omni_moe",
    "qwen3_omni_moe_thinker": "qwen3_omni_moe",
    "GraniteMoeSharedForCausalLM": "granitemoeshared", "granitemoeshared": "granitemoeshared",
    "GraniteMoeHybridForCausalLM": "granitemoehybrid", "granitemoehybrid": "granitemoehybrid",
    "HunYuanMoEV1ForCausalLM": "hunyuan_v1_moe", "hunyuan_v1_moe": "hunyuan_v1_moe",
    "MellumForCausalLM": "mellum", "mellum": "mellum",
    "JambaForCausalLM": "jamba", "jamba": "jamba",
    "Mistral4ForCausalLM": "mistral4", "mistral4": "mistral4",
    "AriaForConditionalGeneration": "aria", "aria": "aria", "AriaTextForCausalLM": "aria", "aria_text": "aria",
    "Ernie4_5_MoeForCausalLM": "ernie4_5_moe", "ernie4_5_moe": "ernie4_5_moe",
    "Ernie4_5_VLMoeForConditionalGeneration": "ernie4_5_vl_moe", "ernie4_5_vl_moe": "ernie4_5_vl_moe",
    "Dots3NoteForConditionalGeneration": "dots3_note", "dots3_note": "dots3_note",
    "Dots3NoteForCausalLM": "dots3_note", "dots3_note_text": "dots3_note",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa", "glm_moe_dsa": "glm_moe_dsa",
    "SolarOpenForCausalLM": "solar_open", "solar_open": "solar_open",
    "Glm4vMoeForConditionalGeneration": "glm4v_moe", "glm4v_moe": "glm4v_moe",
    "KimiLinearForCausalLM": "kimi_linear", "kimi_linear": "kimi_linear",
    "BailingHybridForCausalLM": "bailing_hybrid", "bailing_hybrid": "bailing_hybrid",
    "MiniMaxM2ForCausalLM": "minimax_m2", "minimax_m2": "minimax_m2",
    "HYV3ForCausalLM": "hy_v3", "hy_v3": "hy_v3",
    "AXK2ForCausalLM": "axk2", "axk2": "axk2",
    "Glm5NextForConditionalGeneration": "glm5_next", "glm5_next": "glm5_next",
    "Inkling2ForConditionalGeneration": "inkling2", "inkling2": "inkling2",
    "Inkling2LoopForConditionalGeneration": "inkling2_loop", "inkling2_loop": "inkling2_loop",
    "HYV4ForCausalLM": "hy_v4", "hy_v4": "hy_v4",
    "HYV4VLForConditionalGeneration": "hy_v4_vl", "hy_v4_vl": "hy_v4_vl",
    "AXK1ForCausalLM": "axk1", "axk1": "axk1",
    "Lfm2MoeForCausalLM": "lfm2_moe", "lfm2_moe": "lfm2_moe",
    "Cohere2MoeForCausalLM": "cohere2_moe", "cohere2_moe": "cohere2_moe",
    "LongcatFlashForCausalLM": "longcat_flash", "longcat_flash": "longcat_flash",
    "DeepseekV4ForCausalLM": "deepseek_v4", "deepseek_v4": "deepseek_v4",
    "Step3p7ForConditionalGeneration": "step3p7", "step3p7": "step3p7",
    "MistralLarge4ForConditionalGeneration": "mistral_large4", "mistral_large4": "mistral_large4",
    "DeepseekOcr2ForConditionalGeneration": "deepseek_ocr2", "deepseek_ocr2": "deepseek_ocr2",
    "UnlimitedOcrForConditionalGeneration": "unlimited_ocr", "unlimited_ocr": "unlimited_ocr",
    "NemotronHForCausalLM": "nemotron_h", "nemotron_h": "nemotron_h",
    "DbrxForCausalLM": "dbrx", "dbrx": "dbrx",
}
# LFM2-MoE's (sum + 1e-6) and Cohere2-MoE's configured scoring / shared mix
_KNOBS = ("lfm2_moe", "cohere2_moe")
# Inkling2's softcapped SwiGLU, HY-V4's clamped routed / plain shared experts
_INKLING2 = ("inkling2", "inkling2_loop")
_HY_V4 = ("hy_v4", "hy_v4_vl")
_ACTS = _INKLING2 + _HY_V4 + ("axk1",)
# Branch nongated: experts without a gate projection (h = act(W1 x))
_NONGATED = ("nemotron_h",)


def family_of(cfg):
    arch = (cfg.get("architectures") or [""])[0]
    mt = cfg.get("model_type", "")
    if arch in _FAMILIES:
        return _FAMILIES[arch]
    if mt in _FAMILIES:
        return _FAMILIES[mt]
    raise ValueError(f"unsupported architecture {arch!r} / model_type {mt!r}")


def text_config(cfg, family):
    """The decoder's fields: text_config for the multimodal wrappers."""
    if family == "unlimited_ocr" and isinstance(cfg.get("language_config"), dict):
        return cfg["language_config"]  # UnlimitedOcrConfig: the original checkpoints' name for text_config
    if family == "qwen3_omni_moe" and isinstance((cfg.get("thinker_config") or {}).get("text_config"), dict):
        return cfg["thinker_config"]["text_config"]  # Qwen3OmniMoeConfig: the thinker's text model
    if family in ("llama4", "qwen3_5_moe", "qwen3_vl_moe", "qwen4_exp", "minimax_m3_vl", "qwen3_omni_moe", "aria",
                  "glm4v_moe", "glm5_next", "inkling2", "inkling2_loop", "hy_v4_vl", "step3p7", "mistral_large4", "deepseek_ocr2",
                  "unlimited_ocr", "dots3_note") and isinstance(
                      cfg.get("text_config"), dict):
        return cfg["text_config"]
    return cfg


_MLP_TYPES = ("glm4_moe_lite", "deepseek_v32", "exaone_moe", "mimo_v2_flash")
# DeepSeek-V3's router maths (sigmoid, e_score_correction_bias, top-2-sum groups) under other names
# dots3_note: Dots3NoteTextTopkRouter is the same router (its shared MLP's width differs, below)
_V3_LIKE = ("glm4_moe", "dots1", "dots3_note") + _MLP_TYPES
# More of them (their modeling files: GlmMoeDsaTopkRouter, SolarOpenTopkRouter,
# Glm4vMoeTextTopkRouter, KimiLinearTopkRouter, BailingHybridTopkRouter; MiniMaxM2TopKRouter and
# HYV3TopKRouter without groups, always dividing by the top-k sum); _TYPES_A: MoE layers by
# mlp_layer_types, the config classes filling an absent list from first_k_dense_replace (GLM-5:
# 3, Kimi-Linear: 1, Bailing: 2) or, Hunyuan-V3, with one dense layer first.
_FAM_A = ("glm_moe_dsa", "solar_open", "glm4v_moe", "kimi_linear", "bailing_hybrid", "minimax_m2", "hy_v3",
          "axk2", "glm5_next")
_TYPES_A = {"glm_moe_dsa": 3, "kimi_linear": 1, "bailing_hybrid": 2, "hy_v3": 1, "axk2": 1, "glm5_next": 3}
# config.json names that their config classes' attribute_map writes (Kimi-Linear, Bailing)
_KIMI_NAMES = ("kimi_linear", "bailing_hybrid")


def is_moe_layer(cfg, family, layer):
    if family == "dots3_note":
        # Dots3NoteTextConfig.__post_init__: mlp_layer_types, else i >= first_k_dense_replace (1)
        # and moe_layer_freq (1): bool(freq[i]) for a list, i % freq == 0 for a number
        types = cfg.get("mlp_layer_types")
        if types is not None:
            return types[layer] == "sparse"
        freq = cfg.get("moe_layer_freq", 1)
        return layer >= int(cfg.get("first_k_dense_replace", 1)) and (
            bool(freq[layer]) if isinstance(freq, list) else layer % int(freq) == 0)
    if family in ("mixtral", "gpt_oss", "olmoe", "granitemoe", "qwen3_5_moe", "minimax", "flex_olmo",
                  "kolibri1", "lara_mini", "granitemoe_swa", "qwen4_exp", "phimoe", "jetmoe",
                  "openai_privacy_filter", "granitemoeshared", "granitemoehybrid", "hunyuan_v1_moe", "aria"):
        return True
    if family in ("laguna", "beam", "minimax_m3_vl"):
        # LagunaConfig / BeamConfig fill an absent mlp_layer_types with 1 / min(3, L) dense
        # layers, MiniMaxM3VLTextConfig with none
        types = cfg.get("mlp_layer_types")
        if types is not None:
            return types[layer] == "sparse"
        return layer >= {"laguna": 1, "beam": 3, "minimax_m3_vl": 0}[family]
    if family == "afmoe":
        return layer >= int(_get(cfg, "num_dense_layers", 1))
    if family == "flint":
        dense = cfg.get("mlp_only_layers")
        dense = [0, 1] if dense is None else dense
        return layer not in dense and (layer + 1) % int(_get(cfg, "decoder_sparse_step", 1)) == 0
    if family == "ernie4_5_moe":  # Ernie4_5_MoeDecoderLayer
        end = int(_get(cfg, "moe_layer_end_index", -1))
        end = int(cfg["num_hidden_layers"]) - 1 if end == -1 else end
        return ((layer + 1) % int(_get(cfg, "moe_layer_interval", 1)) == 0
                and int(_get(cfg, "moe_layer_start_index", 1)) <= layer <= end)
    if family == "jamba":  # JambaConfig.layers_num_experts; one expert builds JambaMLP
        period, offset = int(_get(cfg, "expert_layer_period", 2)), int(_get(cfg, "expert_layer_offset", 1))
        return int(cfg.get("num_experts") or cfg.get("num_local_experts") or 16) > 1 and layer % period == offset
    if family == "mellum":  # MellumDecoderLayer; MellumConfig fills an absent list with "sparse"
        types = cfg.get("mlp_layer_types")
        return types is None or types[layer] == "sparse"
    if family in ("solar_open", "minimax_m2"):
        return True
    if family in _TYPES_A:
        types = cfg.get("mlp_layer_types")
        if types is not None:
            return types[layer] == "sparse"
        first = None if family in ("hy_v3", "glm5_next") else cfg.get("first_k_dense_replace")
        # AXK2Config also steps by moe_layer_freq (default 1)
        freq = int(_get(cfg, "moe_layer_freq", 1)) if family == "axk2" else 1
        return layer >= (_TYPES_A[family] if first is None else int(first)) and layer % freq == 0
    if family == "deepseek_ocr2":
        # DeepseekOcr2TextDecoderLayer indexes config.mlp_layer_types (the config class has no default)
        types = cfg.get("mlp_layer_types")
        if types is None:
            raise ValueError("deepseek_ocr2: mlp_layer_types absent (its decoder layers index it)")
        return types[layer] == "sparse"
    if family in ("mistral_large4", "unlimited_ocr"):
        # MistralLarge4TextDecoderLayer, UnlimitedOcrTextDecoderLayer: mlp_layer_types[layer] == "sparse"; MistralLarge4TextConfig
        # fills an absent list with first_k_dense_replace (1) dense layers, then sparse
        types = cfg.get("mlp_layer_types")
        if types is not None:
            return types[layer] == "sparse"
        return layer >= int(_get(cfg, "first_k_dense_replace", 1))
    if family == "glm4v_moe":  # Glm4vMoeTextDecoderLayer: layer_idx >= first_k_dense_replace (1)
        return layer >= int(_get(cfg, "first_k_dense_replace", 1))
    if family in _MLP_TYPES:
        # their DecoderLayers: MoE where config.mlp_layer_types[layer] == "sparse"; the config
        # classes fill an absent list with dense layers first (first_k_dense_replace, or 1)
        types = cfg.get("mlp_layer_types")
        if types is not None:
            return types[layer] == "sparse"
        first = cfg.get("first_k_dense_replace")
        return layer >= ({"deepseek_v32": 3}.get(family, 1) if first is None else int(first))
    if family in ("deepseek_v2", "deepseek_v3", "glm4_moe", "dots1", "mistral4"):
        # Glm4MoeDecoderLayer / Dots1DecoderLayer: layer_idx >= first_k_dense_replace (1 / 0)
        first = cfg.get("first_k_dense_replace")
        first = {"deepseek_v3": 3, "glm4_moe": 1}.get(family, 0) if first is None else int(first)
        return layer >= first and layer % int(cfg.get("moe_layer_freq") or 1) == 0
    if family == "llama4":
        if cfg.get("moe_layers") is not None:
            return layer in cfg["moe_layers"]
        return (layer + 1) % int(cfg.get("interleave_moe_layer_step") or 1) == 0
    if layer in (cfg.get("mlp_only_layers") or []):
        return False
    return (layer + 1) % int(cfg.get("decoder_sparse_step", 1)) == 0


def _get(cfg, key, default):
    v = cfg.get(key)
    return default if v is None else v


def _prefix(ck, fam, layer):
    """The MoE block's tensor prefix: the first candidate that holds the router."""
    cands = {
        "mixtral": [f"model.layers.{layer}.block_sparse_moe.", f"model.layers.{layer}.mlp."],
        "qwen3_5_moe": [f"model.language_model.layers.{layer}.mlp.", f"model.layers.{layer}.mlp."],
        "llama4": [f"language_model.model.layers.{layer}.feed_forward.",
                   f"model.language_model.layers.{layer}.feed_forward.",
                   f"model.layers.{layer}.feed_forward."],
        "granitemoe": [f"model.layers.{layer}.block_sparse_moe."],
        "granitemoe_swa": [f"model.layers.{layer}.block_sparse_moe."],
        "minimax_m3_vl": [f"language_model.model.layers.{layer}.block_sparse_moe."],
        "qwen4_exp": [f"model.language_model.layers.{layer}.mlp.", f"model.layers.{layer}.mlp."],
        "jamba": [f"model.layers.{layer}.feed_forward."],
        "aria": [f"language_model.model.layers.{layer}.mlp.", f"model.language_model.layers.{layer}.mlp.",
                 f"model.layers.{layer}.mlp."],
        "granitemoeshared": [f"model.layers.{layer}.block_sparse_moe."],
        "granitemoehybrid": [f"model.layers.{layer}.block_sparse_moe."],
        "minimax": [f"model.layers.{layer}.block_sparse_moe.", f"model.layers.{layer}.mlp."],
        "phimoe": [f"model.layers.{layer}.block_sparse_moe.", f"model.layers.{layer}.mlp."],
        "qwen3_vl_moe": [f"model.language_model.layers.{layer}.mlp.", f"model.layers.{layer}.mlp."],
        # Qwen3OmniMoeForConditionalGeneration saves the thinker's decoder as thinker.model.layers
        # (transformers' conversion mapping undoes model.language_model); the thinker alone, model.
        "qwen3_omni_moe": [f"thinker.model.layers.{layer}.mlp.", f"thinker.model.language_model.layers.{layer}.mlp.",
                           f"model.layers.{layer}.mlp.", f"model.language_model.layers.{layer}.mlp."],
        "glm4v_moe": [f"model.language_model.layers.{layer}.mlp.", f"model.layers.{layer}.mlp."],
        "dots3_note": [f"model.language_model.layers.{layer}.mlp.", f"model.layers.{layer}.mlp."],
        "glm5_next": [f"model.language_model.layers.{layer}.mlp.", f"model.layers.{layer}.mlp."],
        # transformers' conversion mappings save these under Mixtral's old block name
        "kimi_linear": [f"model.layers.{layer}.block_sparse_moe.", f"model.layers.{layer}.mlp."],
        "minimax_m2": [f"model.layers.{layer}.block_sparse_moe.", f"model.layers.{layer}.mlp."],
        # Mistral's own checkpoint names (save_pretrained reverses mistral_large4's conversion mapping)
        "mistral_large4": [f"layers.{layer}."],
    }.get(fam, [f"model.layers.{layer}.mlp."])
    routers = {"gpt_oss": ["router.weight"], "llama4": ["router.weight"], "afmoe": ["router.gate.weight"],
               "hy_v3": ["router.gate.weight", "gate.weight"],
               "granitemoe_swa": ["router.weight"],
               "openai_privacy_filter": ["router.weight"],
               "granitemoe": ["router.layer.weight", "router.weight"],
               "phimoe": ["gate.weight", "router.weight"],
               "jetmoe": ["router.layer.weight"],
               "granitemoeshared": ["router.layer.weight", "router.weight"],
               "granitemoehybrid": ["router.layer.weight", "router.weight"],
               "hunyuan_v1_moe": ["gate.wg.weight"], "jamba": ["router.weight"],
               "aria": ["router.weight"]}.get(fam, ["gate.weight"])
    for c in cands:
        for r in routers:
            if ck.has(c + r):
                return c, c + r
    return cands[0], cands[0] + routers[0]


def layer_params(ck, layer):
    """Sizes, routing settings and float64 weights of MoE layer `layer`."""
    fam = ck.family
    if fam not in ("mixtral", "qwen2_moe", "qwen3_moe"):
        return layer_params_new(ck, layer)
    cfg = ck.config
    nl = int(cfg["num_hidden_layers"])
    if not 0 <= layer < nl:
        raise IndexError(f"layer {layer} outside [0, {nl})")
    if not is_moe_layer(cfg, fam, layer):
        raise ValueError(f"layer {layer} is a dense layer")
    p = {"family": fam, "H": int(cfg["hidden_size"]), "K": int(cfg["num_experts_per_tok"])}
    if fam == "mixtral":
        p["E"] = int(cfg["num_local_experts"])
        p["I"] = int(cfg["intermediate_size"])
        p["renormalize"] = True
    else:
        # transformers >= 5 writes num_local_experts for Qwen3-MoE; released configs have
        # num_experts.
        p["E"] = int(cfg["num_experts"] if "num_experts" in cfg else cfg["num_local_experts"])
        p["I"] = int(cfg["moe_intermediate_size"])
        p["renormalize"] = bool(cfg.get("norm_topk_prob", False))
    E, I, H = p["E"], p["I"], p["H"]

    pre = f"model.layers.{layer}."
    moe = pre + ("block_sparse_moe." if fam == "mixtral" else "mlp.")
    if fam == "mixtral" and not ck.has(moe + "gate.weight") and ck.has(pre + "mlp.gate.weight"):
        moe = pre + "mlp."  # transformers' in-memory (stacked) naming of Mixtral
    p["router"] = ck.get(moe + "gate.weight")
    stacked = moe + "experts.gate_up_proj"
    if ck.has(stacked):
        gu = ck.get(stacked)
        p["w_gate"], p["w_up"] = gu[:, :I, :], gu[:, I:, :]
        p["w_down"] = ck.get(moe + "experts.down_proj")
    else:
        g, u, dn = ("w1", "w3", "w2") if fam == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        p["w_gate"] = np.stack([ck.get(f"{moe}experts.{e}.{g}.weight") for e in range(E)])
        p["w_up"] = np.stack([ck.get(f"{moe}experts.{e}.{u}.weight") for e in range(E)])
        p["w_down"] = np.stack([ck.get(f"{moe}experts.{e}.{dn}.weight") for e in range(E)])
    for k, shape in (("router", (E, H)), ("w_gate", (E, I, H)), ("w_up", (E, I, H)),
                     ("w_down", (E, H, I))):
        if tuple(p[k].shape) != shape:
            raise ValueError(f"layer {layer}: {k} has shape {p[k].shape}, expected {shape}")
    p["Is"] = 0
    if fam == "qwen2_moe" and int(cfg.get("shared_expert_intermediate_size", 0)) > 0:
        p["Is"] = int(cfg["shared_expert_intermediate_size"])
        s = moe + "shared_expert."
        p["s_gate"] = ck.get(s + "gate_proj.weight")
        p["s_up"] = ck.get(s + "up_proj.weight")
        p["s_down"] = ck.get(s + "down_proj.weight")
        p["s_expert_gate"] = ck.get(moe + "shared_expert_gate.weight")  # [1, H]
    return p


def layer_params_acts(ck, layer):
    """layer_params for _ACTS, from their modeling files (transformers 5.24):
    Inkling2 / Inkling2Loop (Inkling2TopKRouter: sigmoid, top-k on s + e_score_correction_bias --
    saved as gate.bias --, w / (sum + 1e-20) * route_scale; Inkling2SoftcappedSwiGLU; saved as
    model.llm.layers.L.mlp. with experts.w13_weight [E, 2I, H] interleaving gate / up rows);
    HY-V4 (HYV4TopkRouter: Glm4Moe's; HYV4Experts clamp, HYV4MLP shared expert plain
    ACT2FN[hidden_act], its gate saved as linear_gate; MoE layers by mlp_layer_types, absent:
    all but layer 0)."""
    fam = ck.family
    cfg = text_config(ck.config, fam)
    nl = int(cfg["num_hidden_layers"])
    if not 0 <= layer < nl:
        raise IndexError(f"layer {layer} outside [0, {nl})")
    if fam in _HY_V4 + ("axk1",):
        types = cfg.get("mlp_layer_types")  # AXK1Config always writes it
        if not (types[layer] == "sparse" if types is not None else layer >= 1):
            raise ValueError(f"layer {layer} is a dense layer")
    H, K = int(cfg["hidden_size"]), int(cfg["num_experts_per_tok"])
    E = int(cfg.get("n_routed_experts") or cfg.get("num_local_experts"))
    I = int(cfg["moe_intermediate_size"])
    p = {"family": fam, "H": H, "K": K, "E": E, "I": I, "scoring": "sigmoid", "renormalize": True,
         "scale": 1.0, "n_group": 1, "topk_group": 1, "group_score": "top2_sum", "sel_bias": None,
         "router_bias": None, "act": "swiglu", "on_input": False, "Is": 0, "shared_gated": False,
         "biases": None}
    acts = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh",
            "gelu_new": "geglu_tanh"}
    if fam in _INKLING2:
        if _get(cfg, "scoring_func", "sigmoid") != "sigmoid":
            raise ValueError("Inkling2 with scoring_func other than sigmoid is not modelled here")
        moe = f"model.llm.layers.{layer}.mlp."
        p.update(scale=float(_get(cfg, "route_scale", _get(cfg, "routed_scaling_factor", 8.0))),
                 act="swiglu_softcap", cg=float(_get(cfg, "mlp_gate_softcap", 4.0)),
                 cu=float(_get(cfg, "mlp_up_softcap", 25.0)))
        p["router"] = ck.get(moe + "gate.weight")
        p["sel_bias"] = ck.get(moe + "gate.bias")
        gu = ck.get(moe + "experts.w13_weight")             # [E, 2I, H], gate row i at 2i, up at 2i + 1
        p["w_gate"], p["w_up"] = gu[:, 0::2, :], gu[:, 1::2, :]
        p["w_down"] = ck.get(moe + "experts.w2_weight")     # [E, H, I]
    else:
        moe, router_name = _prefix(ck, fam, layer)
        if fam == "axk1":  # AXK1TopkRouter: DeepSeek-V3's (8 groups keep 4, 2.5); AXK1MoE: + post_mlp_layernorm
            p.update(renormalize=bool(_get(cfg, "norm_topk_prob", True)),
                     scale=float(_get(cfg, "routed_scaling_factor", 2.5)), n_group=int(_get(cfg, "n_group", 8)),
                     topk_group=int(_get(cfg, "topk_group", 4)), act=acts[_get(cfg, "hidden_act", "silu")],
                     norm_eps=float(_get(cfg, "rms_norm_eps", 1e-6)),
                     out_norm=ck.get(f"model.layers.{layer}.post_mlp_layernorm.weight"))
        else:
            p.update(renormalize=bool(_get(cfg, "norm_topk_prob", True)),
                     scale=float(_get(cfg, "routed_scaling_factor", 2.827)), n_group=int(_get(cfg, "n_group", 1)),
                     topk_group=int(_get(cfg, "topk_group", 1)), act="swiglu_clamp",
                     limit=float(_get(cfg, "swiglu_limit", 10.0)), s_act=acts[_get(cfg, "hidden_act", "silu")])
        p["router"] = ck.get(router_name)
        p["sel_bias"] = ck.get(moe + "gate.e_score_correction_bias")
        if ck.has(moe + "experts.gate_up_proj"):
            gu = ck.get(moe + "experts.gate_up_proj")       # [E, 2I, H], gate = the first I rows
            p["w_gate"], p["w_up"] = gu[:, :I, :], gu[:, I:, :]
            p["w_down"] = ck.get(moe + "experts.down_proj")
        else:  # per expert, as A.X-K1's conversion mapping (Qwen2-MoE's) saves them
            for k, n in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
                p[k] = np.stack([ck.get(f"{moe}experts.{e}.{n}.weight") for e in range(E)])
        p["Is"] = int(_get(cfg, "n_shared_experts", 1) or 0) * I
        if p["Is"]:
            s = moe + "shared_experts."
            p["s_gate"] = ck.get(s + ("linear_gate.weight" if ck.has(s + "linear_gate.weight") else "gate_proj.weight"))
            p["s_up"], p["s_down"] = ck.get(s + "up_proj.weight"), ck.get(s + "down_proj.weight")
    for k, shape in (("router", (E, H)), ("w_gate", (E, I, H)), ("w_up", (E, I, H)), ("w_down", (E, H, I))):
        if tuple(p[k].shape) != shape:
            raise ValueError(f"layer {layer}: {k} has shape {p[k].shape}, expected {shape}")
    return p


def layer_params_knobs(ck, layer):
    """layer_params for _KNOBS, from their modeling files (transformers 5.24):
    LFM2-MoE (Lfm2MoeTopKRouter: s = sigmoid(l); top-k on s + the block's expert_bias when
    use_expert_bias (default true); w = s of the chosen, / (sum + 1e-6) when norm_topk_prob
    (default true), * routed_scaling_factor (1); Lfm2MoeExperts: F.silu; MoE layers >=
    num_dense_layers (2); saved as model.layers.L.feed_forward.experts.e.w1 / w3 / w2);
    Cohere2-MoE (Cohere2MoeTopKRouter: top-k on the logits; expert_selection_fn "softmax": the
    softmax of the k; "sigmoid": their sigmoid, / sum (no epsilon) when norm_topk_prob (true);
    Cohere2MoeSparseMoeBlock: num_shared_experts (0) * intermediate_size shared experts,
    shared_expert_combination_strategy "average" (routed + shared) / 2 or "sum"; MoE layers where
    mlp_layer_types is "sparse"; saved per expert as gate_proj / up_proj / down_proj)."""
    fam = ck.family
    cfg = ck.config
    nl = int(cfg["num_hidden_layers"])
    if not 0 <= layer < nl:
        raise IndexError(f"layer {layer} outside [0, {nl})")
    H, K, E = int(cfg["hidden_size"]), int(cfg["num_experts_per_tok"]), int(cfg["num_experts"])
    p = {"family": fam, "H": H, "K": K, "E": E, "n_group": 1, "topk_group": 1, "group_score": "max",
         "sel_bias": None, "router_bias": None, "on_input": False, "Is": 0, "shared_gated": False, "biases": None}
    if fam == "lfm2_moe":
        if layer < int(_get(cfg, "num_dense_layers", 2)):
            raise ValueError(f"layer {layer} is a dense layer")
        I = int(cfg["moe_intermediate_size"])
        moe = f"model.layers.{layer}.feed_forward."
        names = ("w1", "w3", "w2")
        p.update(I=I, scoring="sigmoid", renormalize=bool(_get(cfg, "norm_topk_prob", True)), renorm_eps=1e-6,
                 scale=float(_get(cfg, "routed_scaling_factor", 1.0)), act="swiglu")
        if _get(cfg, "use_expert_bias", True):
            p["sel_bias"] = ck.get(moe + "expert_bias")
    else:
        types = cfg.get("mlp_layer_types")
        if types is not None and types[layer] != "sparse":
            raise ValueError(f"layer {layer} is a dense layer")
        I = int(cfg["intermediate_size"])
        moe = f"model.layers.{layer}.mlp."
        names = ("gate_proj", "up_proj", "down_proj")
        sel = _get(cfg, "expert_selection_fn", "softmax")
        if sel not in ("softmax", "sigmoid"):
            raise ValueError(f"expert_selection_fn {sel!r}")
        p.update(I=I, scoring="topk_" + sel, renormalize=sel == "sigmoid" and bool(_get(cfg, "norm_topk_prob", True)),
                 renorm_eps=0.0, scale=1.0,
                 act={"silu": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh"}[_get(cfg, "hidden_act", "silu")])
        p["Is"] = int(_get(cfg, "num_shared_experts", 0)) * I
        if p["Is"]:
            comb = _get(cfg, "shared_expert_combination_strategy", "average")
            if comb not in ("average", "sum"):
                raise ValueError(f"shared_expert_combination_strategy {comb!r}")
            p["average"] = comb == "average"
            s = moe + "shared_experts."
            p["s_gate"], p["s_up"], p["s_down"] = (ck.get(s + n + ".weight") for n in names)
    p["router"] = ck.get(moe + "gate.weight")
    for k, n in zip(("w_gate", "w_up", "w_down"), names):
        p[k] = np.stack([ck.get(f"{moe}experts.{e}.{n}.weight") for e in range(E)])
    for k, shape in (("router", (E, H)), ("w_gate", (E, I, H)), ("w_up", (E, I, H)), ("w_down", (E, H, I))):
        if tuple(p[k].shape) != shape:
            raise ValueError(f"layer {layer}: {k} has shape {p[k].shape}, expected {shape}")
    return p


def layer_params_v4step(ck, layer):
    """layer_params for DeepSeek-V4 and Step-3.7, from their modeling files (transformers 5.24).
    DeepSeek-V4 (deepseek_v4/modeling_deepseek_v4.py): DeepseekV4TopKRouter scores
    sqrt(softplus(l)), top-k of the scores + e_score_correction_bias (saved as ffn.gate.bias), w /
    (sum + 1e-20) * routed_scaling_factor (default 1.5); DeepseekV4Experts and the one shared
    DeepseekV4MLP (moe_intermediate_size wide) apply act(min(g, L)) * clamp(u, -L, L), L =
    swiglu_limit (10); experts saved per expert as ffn.experts.e.w1 / w3 / w2, the shared one as
    ffn.shared_experts.w1 / w3 / w2; the "hash_moe" layers route by token id: not modelled.
    Step-3.7 (step3p7/modeling_step3p7.py, text_config): Step3p7TopKRouter sigmoid + bias
    (moe.router_bias), w / sum; the routed sum times moe_router_scaling_factor (1); experts
    min(act(g), L) * clamp(u, -L, L) with L = swiglu_limits[layer] (None / 0: no clamp), the
    shared Step3p7MLP (share_expert_dim, saved beside the block as share_expert.) with
    swiglu_limits_shared[layer]; experts stacked as moe.gate_proj / up_proj / down_proj.weight."""
    fam = ck.family
    cfg = text_config(ck.config, fam)
    nl = int(cfg["num_hidden_layers"])
    if not 0 <= layer < nl:
        raise IndexError(f"layer {layer} outside [0, {nl})")
    types = cfg.get("mlp_layer_types")
    H, K = int(cfg["hidden_size"]), int(cfg["num_experts_per_tok"])
    E = int(cfg.get("n_routed_experts") or cfg.get("num_local_experts"))
    I = int(cfg["moe_intermediate_size"])
    if _get(cfg, "hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError("only silu is modelled here")
    p = {"family": fam, "H": H, "K": K, "E": E, "I": I, "renormalize": True, "n_group": 1, "topk_group": 1,
         "group_score": "max", "router_bias": None, "on_input": False, "shared_gated": False, "biases": None}
    if fam == "deepseek_v4":
        if types is not None and types[layer] == "hash_moe":
            raise ValueError(f"layer {layer} is a hash_moe layer (token-id routing)")
        if _get(cfg, "scoring_func", "sqrtsoftplus") != "sqrtsoftplus":
            raise ValueError("DeepSeek-V4 scoring other than sqrtsoftplus is not modelled here")
        moe = f"model.layers.{layer}.ffn."
        p.update(scoring="sqrtsoftplus", scale=float(_get(cfg, "routed_scaling_factor", 1.5)), act="swiglu_clamp",
                 limit=float(_get(cfg, "swiglu_limit", 10.0)), Is=I)
        p["router"], p["sel_bias"] = ck.get(moe + "gate.weight"), ck.get(moe + "gate.bias")
        for k, n in (("w_gate", "w1"), ("w_up", "w3"), ("w_down", "w2")):
            p[k] = np.stack([ck.get(f"{moe}experts.{e}.{n}.weight") for e in range(E)])
        s = moe + "shared_experts."
        p["s_gate"], p["s_up"], p["s_down"] = (ck.get(s + n + ".weight") for n in ("w1", "w3", "w2"))
    else:
        if not (types[layer] == "sparse" if types is not None else layer >= 3):
            raise ValueError(f"layer {layer} is a dense layer")
        moe = f"model.layers.{layer}.moe."
        lim = (cfg.get("swiglu_limits") or [])
        lsh = (cfg.get("swiglu_limits_shared") or [])
        lr = (lim[layer] if layer < len(lim) else None) or 0.0
        ls = (lsh[layer] if layer < len(lsh) else None) or 0.0
        p.update(scoring="sigmoid", scale=float(_get(cfg, "moe_router_scaling_factor", 1.0)),
                 act="swiglu_postclamp" if lr else "swiglu", limit=float(lr),
                 s_act="swiglu_postclamp" if ls else "swiglu", s_limit=float(ls),
                 Is=int(_get(cfg, "share_expert_dim", 1280)))
        p["router"], p["sel_bias"] = ck.get(moe + "gate.weight"), ck.get(moe + "router_bias")
        p["w_gate"], p["w_up"] = ck.get(moe + "gate_proj.weight"), ck.get(moe + "up_proj.weight")
        p["w_down"] = ck.get(moe + "down_proj.weight")
        s = f"model.layers.{layer}.share_expert."
        p["s_gate"], p["s_up"], p["s_down"] = (ck.get(s + n + "_proj.weight") for n in ("gate", "up", "down"))
    for k, shape in (("router", (E, H)), ("w_gate", (E, I, H)), ("w_up", (E, I, H)), ("w_down", (E, H, I))):
        if tuple(p[k].shape) != shape:
            raise ValueError(f"layer {layer}: {k} has shape {p[k].shape}, expected {shape}")
    return p


def layer_params_longcat(ck, layer):
    """LongCat-Flash (transformers 5.24 longcat_flash/modeling_longcat_flash.py): every layer's
    LongcatFlashMoE; LongcatFlashTopkRouter: logits = classifier.weight [E + Z, H] x (no bias),
    softmax over all E + Z, top-k (moe_topk) on scores + e_score_correction_bias, the weights
    the scores (not renormalized) times routed_scaling_factor (default 6); LongcatFlashExperts:
    an id >= n_routed_experts (E) is the identity, its term w * x. Z = zero_expert_num (default
    256, null 0); I = expert_ffn_hidden_size; the layer count is num_layers."""
    cfg = ck.config
    nl = int(cfg["num_layers"])
    if not 0 <= layer < nl:
        raise IndexError(f"layer {layer} outside [0, {nl})")
    if cfg.get("zero_expert_type", "identity") != "identity":
        raise ValueError(f"zero_expert_type {cfg['zero_expert_type']!r} is not modelled here")
    H, K = int(cfg["hidden_size"]), int(_get(cfg, "moe_topk", 12))
    E, I = int(_get(cfg, "n_routed_experts", 512)), int(_get(cfg, "expert_ffn_hidden_size", 2048))
    Z = int(cfg["zero_expert_num"] or 0) if "zero_expert_num" in cfg else 256
    moe = f"model.layers.{layer}.mlp."
    p = {"family": "longcat_flash", "H": H, "K": K, "E": E, "I": I, "Z": Z, "scoring": "softmax",
         "renormalize": False, "scale": float(_get(cfg, "routed_scaling_factor", 6.0)), "n_group": 1,
         "sel_bias": ck.get(moe + "router.e_score_correction_bias"), "router_bias": None,
         "router": ck.get(moe + "router.classifier.weight"), "act": "swiglu", "on_input": False, "Is": 0}
    for k, n in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
        p[k] = np.stack([ck.get(f"{moe}experts.{e}.{n}.weight") for e in range(E)])
    for k, shape in (("router", (E + Z, H)), ("sel_bias", (E + Z,)), ("w_gate", (E, I, H)), ("w_up", (E, I, H)),
                     ("w_down", (E, H, I))):
        if tuple(p[k].shape) != shape:
            raise ValueError(f"layer {layer}: {k} has shape {p[k].shape}, expected {shape}")
    return p


def layer_params_nongated(ck, layer):
    """layer_params for _NONGATED, from transformers 5.24 nemotron_h/modeling_nemotron_h.py:
    NemotronHTopkRouter (sigmoid of f32 logits; top-k of s + e_score_correction_bias among the
    topk_group groups best by their top-2 sum, n_group default 1; weights = s of the chosen,
    / (sum + 1e-20) when norm_topk_prob (default true), * routed_scaling_factor (default 1.0));
    NemotronHExperts down_proj(ACT2FN[mlp_hidden_act](up_proj x)), default relu2; plus
    shared_experts, a NemotronHMLP of moe_shared_expert_intermediate_size (default 7688) with the
    same activation, ungated. The MoE layers: layers_block_type[L] == "moe", else the legacy
    hybrid_override_pattern[L] == "E"; saved under backbone.layers.L.mixer."""
    cfg = ck.config
    types = cfg.get("layers_block_type")
    if types is None and cfg.get("hybrid_override_pattern") is not None:
        types = ["moe" if ch == "E" else "other" for ch in cfg["hybrid_override_pattern"]]
    if types is None:
        types = ["linear_attention", "moe", "full_attention", "mlp"]
    if not 0 <= layer < len(types):
        raise IndexError(f"layer {layer} outside [0, {len(types)})")
    if types[layer] != "moe":
        raise ValueError(f"layer {layer} is a dense layer")
    if cfg.get("moe_latent_size") is not None or cfg.get("mlp_bias"):
        raise ValueError("Nemotron-H with latent projections or mlp_bias is not modelled here")
    H, K = int(cfg["hidden_size"]), int(cfg["num_experts_per_tok"])
    E = int(cfg.get("n_routed_experts") or cfg.get("num_local_experts"))
    I = int(cfg["moe_intermediate_size"])
    act = {"relu": "relu", "relu2": "relu2", "gelu": "gelu", "gelu_new": "gelu_tanh",
           "gelu_pytorch_tanh": "gelu_tanh"}[_get(cfg, "mlp_hidden_act", "relu2")]
    p = {"family": ck.family, "H": H, "K": K, "E": E, "I": I, "scoring": "sigmoid",
         "renormalize": bool(_get(cfg, "norm_topk_prob", True)), "scale": float(_get(cfg, "routed_scaling_factor", 1.0)),
         "n_group": int(_get(cfg, "n_group", 1)), "topk_group": int(_get(cfg, "topk_group", 1)),
         "group_score": "top2_sum", "router_bias": None, "act": act, "on_input": False, "shared_gated": False,
         "biases": None, "w_gate": None}
    moe = None
    for c in (f"backbone.layers.{layer}.mixer.", f"model.layers.{layer}.mixer."):
        if ck.has(c + "gate.weight"):
            moe = c
            break
    if moe is None:
        raise ValueError(f"layer {layer}: no mixer.gate.weight")
    p["router"] = ck.get(moe + "gate.weight")
    p["sel_bias"] = ck.get(moe + "gate.e_score_correction_bias")
    p["w_up"] = np.stack([ck.get(f"{moe}experts.{e}.up_proj.weight") for e in range(E)])
    p["w_down"] = np.stack([ck.get(f"{moe}experts.{e}.down_proj.weight") for e in range(E)])
    p["Is"] = int(_get(cfg, "moe_shared_expert_intermediate_size", 7688) or 0)
    if p["Is"]:
        s = moe + "shared_experts."
        p["s_gate"], p["s_up"], p["s_down"] = None, ck.get(s + "up_proj.weight"), ck.get(s + "down_proj.weight")
        p["s_act"] = act
    for k, shape in (("router", (E, H)), ("w_up", (E, I, H)), ("w_down", (E, H, I))):
        if tuple(p[k].shape) != shape:
            raise ValueError(f"layer {layer}: {k} has shape {p[k].shape}, expected {shape}")
    return p


def layer_params_ernie_vl(ck, layer):
    """layer_params for ernie4_5_vl_moe, from transformers 5.24 ernie4_5_vl_moe/
    modeling_ernie4_5_vl_moe.py: Ernie4_5_VLMoeMoeBlock sends text tokens to text_moe and image /
    video tokens to vision_moe, each an Ernie4_5_VLMoeSparseMoeBlock whose
    Ernie4_5_VLMoeMoeTopKRouter takes the f32 softmax of the logits, the top-k of the scores +
    its moe_statics.e_score_correction_bias, and weights the unbiased scores / clamp(sum,
    moe_norm_min); plus shared_experts, an Ernie4_5_VLMoeMLP of moe_intermediate_size[0] *
    moe_num_shared_experts, for every token. The fields are in text_config; decoder layer L is
    MoE when mlp_layer_types[L] == "sparse" (absent: every layer but the first). The saved
    (released) names, conversion_mapping.py's ernie4_5_vl_moe entries reversed: mlp.gate.weight
    (text) and mlp.gate.weight_1 (vision), each [H, E]; moe_statics.e_score_correction_bias
    [2, E], its rows the text's and the vision's; experts.<e>.{gate,up,down}_proj, the text
    experts first (0..E-1), then the vision ones. ck.expert_set picks the modality ("text" or
    None, "vision"): one block of the two, run on every token."""
    cfg = ck.config.get("text_config") if isinstance(ck.config.get("text_config"), dict) else ck.config
    nl = int(cfg["num_hidden_layers"])
    if not 0 <= layer < nl:
        raise IndexError(f"layer {layer} outside [0, {nl})")
    types = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (nl - 1)
    if types[layer] != "sparse":
        raise ValueError(f"layer {layer} is a dense layer")
    if cfg.get("use_bias"):
        raise ValueError("ERNIE-4.5-VL with use_bias is not modelled here")
    vision = getattr(ck, "expert_set", None) == "vision"
    sizes = cfg.get("moe_intermediate_size") or [1536, 512]
    H, K = int(cfg["hidden_size"]), int(cfg.get("moe_k", cfg.get("num_experts_per_tok", 6)))
    E = int(cfg.get("moe_num_experts") or cfg.get("num_experts") or 64)
    I = int(sizes[1 if vision else 0])
    if float(_get(cfg, "moe_norm_min", 1e-12)) > 1.0 / E:
        raise ValueError("moe_norm_min > 1/E: the clamp may bind; not modelled here")
    act = {"silu": "swiglu", "swish": "swiglu"}[_get(cfg, "hidden_act", "silu")]
    moe = f"model.layers.{layer}.mlp."
    p = {"family": ck.family, "H": H, "K": K, "E": E, "I": I, "scoring": "softmax", "renormalize": True,
         "scale": 1.0, "n_group": 1, "topk_group": 1, "group_score": "max", "router_bias": None, "act": act,
         "on_input": False, "shared_gated": False, "biases": None}
    p["router"] = ck.get(moe + ("gate.weight_1" if vision else "gate.weight")).T  # saved [H, E]
    p["sel_bias"] = ck.get(moe + "moe_statics.e_score_correction_bias")[1 if vision else 0]
    base = E if vision else 0
    for k, proj in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
        p[k] = np.stack([ck.get(f"{moe}experts.{base + e}.{proj}.weight") for e in range(E)])
    p["Is"] = int(_get(cfg, "moe_num_shared_experts", 2) or 0) * int(sizes[0])
    if p["Is"]:
        s = moe + "shared_experts."
        p["s_gate"], p["s_up"], p["s_down"] = (ck.get(s + "gate_proj.weight"), ck.get(s + "up_proj.weight"),
                                               ck.get(s + "down_proj.weight"))
    for k, shape in (("router", (E, H)), ("w_gate", (E, I, H)), ("w_up", (E, I, H)), ("w_down", (E, H, I))):
        if tuple(p[k].shape) != shape:
            raise ValueError(f"layer {layer}: {k} has shape {p[k].shape}, expected {shape}")
    return p


def layer_params_dbrx(ck, layer):
    """layer_params for DBRX, from transformers 5.24 dbrx/configuration_dbrx.py and
    modeling_dbrx.py: DbrxConfig's d_model and n_layers; the block's fields in ffn_config
    (DbrxFFNConfig: ffn_hidden_size 3584, moe_num_experts 4, moe_top_k 1, ffn_act_fn {"name":
    "silu"}, moe_normalize_expert_weights 1.0 when absent); every DbrxBlock has a DbrxFFN.
    DbrxFFN.route_tokens_to_experts: softmax, top-k, w / torch.norm(w, p) unless p is None (no
    epsilon). DbrxExpertGLU: w1, v1, w2 [E I, H], viewed per expert as [I, H]; expert e is
    act(x w1_e^T) * (x v1_e^T) @ w2_e. Saved as transformer.blocks.L.ffn."""
    cfg = ck.config
    nl = int(cfg["n_layers"])
    if not 0 <= layer < nl:
        raise IndexError(f"layer {layer} outside [0, {nl})")
    ffn = cfg.get("ffn_config") or {}
    H = int(cfg["d_model"])
    I, E, K = int(ffn.get("ffn_hidden_size", 3584)), int(ffn.get("moe_num_experts", 4)), int(ffn.get("moe_top_k", 1))
    pnorm = ffn.get("moe_normalize_expert_weights", 1.0)
    name = (ffn.get("ffn_act_fn") or {}).get("name", "silu")
    act = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_new": "geglu_tanh",
           "gelu_pytorch_tanh": "geglu_tanh"}[name]
    pre = f"transformer.blocks.{layer}.ffn."
    split = lambda t: ck.get(pre + "experts.mlp." + t).reshape(E, I, H)  # DbrxExperts' view(-1, I, H)
    p = {"family": "dbrx", "H": H, "K": K, "E": E, "I": I, "scoring": "softmax", "renormalize": pnorm is not None,
         "renorm_p": None if pnorm is None else float(pnorm), "renorm_eps": 0.0, "scale": 1.0, "n_group": 1,
         "router_bias": None, "sel_bias": None, "act": act, "on_input": False, "biases": None, "Is": 0,
         "router": ck.get(pre + "router.layer.weight"), "w_gate": split("w1"), "w_up": split("v1"),
         "w_down": np.transpose(split("w2"), (0, 2, 1))}  # h @ w2_e = (w2_e^T) h
    if tuple(p["router"].shape) != (E, H):
        raise ValueError(f"layer {layer}: router has shape {p['router'].shape}, expected {(E, H)}")
    return p


def layer_params_new(ck, layer):
    """layer_params for the families after Mixtral / Qwen2/3-MoE."""
    fam = ck.family
    if fam == "ernie4_5_vl_moe":
        return layer_params_ernie_vl(ck, layer)
    if fam == "dbrx":
        return layer_params_dbrx(ck, layer)
    if fam == "longcat_flash":
        return layer_params_longcat(ck, layer)
    if fam in _ACTS:
        return layer_params_acts(ck, layer)
    if fam in _KNOBS:
        return layer_params_knobs(ck, layer)
    if fam in ("deepseek_v4", "step3p7"):
        return layer_params_v4step(ck, layer)
    if fam in _NONGATED:
        return layer_params_nongated(ck, layer)
    cfg = text_config(ck.config, fam)
    nl = int(cfg["num_hidden_layers"])
    if not 0 <= layer < nl:
        raise IndexError(f"layer {layer} outside [0, {nl})")
    if not is_moe_layer(cfg, fam, layer):
        raise ValueError(f"layer {layer} is a dense layer")
    H = int(cfg["hidden_size"])
    if fam == "ernie4_5_moe":
        K = int(cfg.get("moe_k", cfg.get("num_experts_per_tok")))
    elif fam in ("hunyuan_v1_moe", "aria"):
        # HunYuanMoEV1Config, AriaTextConfig: moe_topk (num_experts_per_tok maps onto it), an int or per layer
        K = cfg.get("moe_topk", cfg.get("num_experts_per_tok"))
        K = int(K[layer] if isinstance(K, list) else K)
    elif fam in _KIMI_NAMES and "num_experts_per_token" in cfg:
        K = int(cfg["num_experts_per_token"])
    else:
        K = int(cfg["num_experts_per_tok"])
    v3 = fam == "deepseek_v3" or fam in _V3_LIKE  # sigmoid + e_score_correction_bias
    if fam in _FAM_A:
        E = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts"))
        I = int(cfg["intermediate_size" if fam == "minimax_m2" else "moe_intermediate_size"])
    elif fam in ("deepseek_v2", "deepseek_v3", "mistral4", "mistral_large4", "deepseek_ocr2", "unlimited_ocr") + _V3_LIKE:
        E = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts"))
        I = int(cfg["moe_intermediate_size"])
    elif fam == "ernie4_5_moe":
        E = int(cfg.get("moe_num_experts") or cfg.get("num_experts"))
        I = int(cfg["moe_intermediate_size"])
    elif fam in ("qwen3_5_moe", "qwen3_next", "qwen3_vl_moe", "qwen3_omni_moe", "mellum", "laguna", "kolibri1",
                 "beam", "afmoe", "flint", "lara_mini", "qwen4_exp"):
        E = int(cfg.get("num_experts") or cfg.get("num_local_experts"))
        I = int(cfg["moe_intermediate_size"])
    else:  # Mixtral-like sizes (and MiniMax-M3's; Aria's moe_num_experts)
        E = int(cfg.get("moe_num_experts") or cfg.get("num_local_experts") or cfg.get("num_experts"))
        I = int(cfg["intermediate_size"])
    p = {"family": fam, "H": H, "K": K, "E": E, "I": I, "scoring": "softmax", "renormalize": False,
         "scale": 1.0, "n_group": 1, "topk_group": 1, "group_score": "max", "sel_bias": None,
         "router_bias": None, "act": "swiglu", "on_input": False, "Is": 0, "shared_gated": False,
         "biases": None}
    if fam in _FAM_A:
        if fam in ("minimax_m2", "hy_v3"):  # no groups; always w / (sum w + 1e-20)
            p.update(scoring="sigmoid", renormalize=True,
                     scale=float(_get(cfg, "router_scaling_factor", 2.826)) if fam == "hy_v3" else 1.0)
        else:
            kimi = fam in _KIMI_NAMES
            g, k = (8, 4) if fam == "bailing_hybrid" else (1, 1)
            if fam == "axk2" and _get(cfg, "n_group", 1) > 1:
                raise ValueError("A.X-K2 with expert groups (its 0.0-filled group mask) is not modelled here")
            scale0 = {"glm_moe_dsa": 2.5, "kimi_linear": 2.446, "bailing_hybrid": 2.5, "axk2": 2.5,
                      "glm5_next": 2.5}.get(fam, 1.0)
            # Kimi / Bailing: their own names, else the attribute_map ones
            p.update(scoring="sigmoid",
                     renormalize=bool(_get(cfg, "moe_renormalize", _get(cfg, "norm_topk_prob", True)) if kimi
                                      else _get(cfg, "norm_topk_prob", True)),
                     scale=float(_get(cfg, "routed_scaling_factor", scale0)),
                     n_group=int(_get(cfg, "num_expert_group", _get(cfg, "n_group", g)) if kimi
                                 else _get(cfg, "n_group", g)),
                     topk_group=int(_get(cfg, "topk_group", k)), group_score="top2_sum")
    elif fam == "deepseek_v3":
        p.update(scoring="sigmoid", renormalize=bool(_get(cfg, "norm_topk_prob", True)),
                 scale=float(_get(cfg, "routed_scaling_factor", 2.5)), n_group=int(_get(cfg, "n_group", 8)),
                 topk_group=int(_get(cfg, "topk_group", 4)), group_score="top2_sum")
    elif fam in _V3_LIKE:
        # Glm4MoeTopkRouter and its copies: DeepSeek-V3's maths; the config classes' defaults
        # (n_group / topk_group 1, 8 / 4 for V3.2; routed_scaling_factor; norm_topk_prob true but
        # for dots1)
        g, k = (8, 4) if fam == "deepseek_v32" else (1, 1)
        scale0 = {"glm4_moe_lite": 1.8, "deepseek_v32": 2.5, "exaone_moe": 2.5}.get(fam, 1.0)
        p.update(scoring="sigmoid", renormalize=bool(_get(cfg, "norm_topk_prob", fam != "dots1")),
                 scale=float(_get(cfg, "routed_scaling_factor", scale0)), n_group=int(_get(cfg, "n_group", g)),
                 topk_group=int(_get(cfg, "topk_group", k)), group_score="top2_sum")
    elif fam == "mistral4":
        # Mistral4TopkRouter: softmax scores, DeepSeek-V3's top-2-sum groups without a bias
        p.update(renormalize=bool(_get(cfg, "norm_topk_prob", True)),
                 scale=float(_get(cfg, "routed_scaling_factor", 1.0)), n_group=int(_get(cfg, "n_group", 1)),
                 topk_group=int(_get(cfg, "topk_group", 1)), group_score="top2_sum")
    elif fam == "mistral_large4":
        # MistralLarge4TextTopkRouter: Mistral4TopkRouter in f32 with the renormalization always on
        p.update(renormalize=True, scale=float(_get(cfg, "routed_scaling_factor", 1.0)),
                 n_group=int(_get(cfg, "n_group", 1)), topk_group=int(_get(cfg, "topk_group", 1)),
                 group_score="top2_sum")
    elif fam == "ernie4_5_moe":
        # Ernie4_5_MoeTopKRouter: / clamp(sum, moe_norm_min): the sum itself for any norm_min <= 1/E
        if float(_get(cfg, "moe_norm_min", 1e-12)) > 1.0 / E:
            raise ValueError("moe_norm_min > 1/E: the clamp may bind; not modelled here")
        p["renormalize"] = True
    elif fam in ("minimax", "qwen3_vl_moe", "hunyuan_v1_moe"):
        p["renormalize"] = True  # their TopKRouters divide by the top-k sum unconditionally
    elif fam in ("deepseek_v2", "deepseek_ocr2", "unlimited_ocr"):
        # DeepseekV2TopkRouter; DeepseekOcr2TextTopkRouter and UnlimitedOcrTextTopkRouter are the same code
        if fam != "deepseek_v2" and _get(cfg, "mlp_bias", False):
            raise ValueError(f"{fam}: mlp_bias (biased shared experts) is not modelled here")
        p["scale"] = float(_get(cfg, "routed_scaling_factor", 1.0))
        if _get(cfg, "topk_method", "greedy") == "group_limited_greedy":
            p.update(n_group=int(cfg["n_group"]), topk_group=int(cfg["topk_group"]))
    elif fam in ("gpt_oss", "granitemoe", "granitemoe_swa", "jetmoe", "openai_privacy_filter", "granitemoeshared",
                 "granitemoehybrid", "aria"):
        # JetMoeTopKGating: logits.topk, softmax of the k. OpenAIPrivacyFilterTopKRouter: the same
        # (with the router bias) divided by top_k, the block's output times top_k: the same sum
        p["scoring"] = "topk_softmax"
        if fam == "granitemoe_swa" and int(cfg.get("shared_intermediate_size") or 0) > 0:
            raise ValueError("granitemoe_swa: shared_intermediate_size > 0 (shared_mlp outside the block)")
    elif fam == "llama4":
        p.update(scoring="topk_sigmoid", on_input=True)
    elif fam in ("olmoe", "qwen3_next", "flex_olmo", "qwen3_omni_moe", "mellum"):  # FlexOlmoTopKRouter: as OLMoE's
        # Qwen3OmniMoeThinkerTextTopKRouter, MellumTopKRouter: Qwen3-MoE's; their configs default it true
        p["renormalize"] = bool(_get(cfg, "norm_topk_prob", fam in ("qwen3_next", "qwen3_omni_moe", "mellum")))
    elif fam == "qwen3_5_moe":
        p["renormalize"] = True
    elif fam == "minimax_m3_vl":
        p.update(scoring="sigmoid", renormalize=True, scale=float(_get(cfg, "routed_scaling_factor", 2.0)))
    elif fam in ("laguna", "afmoe"):
        key = "moe_routed_scaling_factor" if fam == "laguna" else "route_scale"
        p.update(scoring="sigmoid", renormalize=True, scale=float(_get(cfg, key, 1.0)))
    elif fam == "kolibri1":  # top-k on the biased logits, sigmoid of the selected
        p.update(scoring="topk_sigmoid", renormalize=bool(_get(cfg, "norm_topk_prob", False)))
    elif fam == "beam":
        p.update(scoring="sigmoid", renormalize=bool(_get(cfg, "norm_topk_prob", True)),
                 scale=float(_get(cfg, "routed_scaling_factor", 2.5)), n_group=int(_get(cfg, "n_group", 8)),
                 topk_group=int(_get(cfg, "topk_group", 4)), group_score="top2_sum")
    elif fam == "flint":
        p.update(scoring="sigmoid", renormalize=bool(_get(cfg, "norm_topk_prob", True)))
    elif fam in ("lara_mini", "qwen4_exp"):
        p["renormalize"] = bool(_get(cfg, "norm_topk_prob", True))
    elif fam == "phimoe":
        # PhimoeTopKRouter: sparsemixer(router_logits, jitter_eps=router_jitter_noise), eval mode
        p.update(scoring="sparsemixer", eps=float(_get(cfg, "router_jitter_noise", 0.01)))
    if fam == "glm5_next":
        # Glm5NextTextExperts._apply_gate and Glm5NextTextMLP: silu(min(g, L)) * clamp(u, -L, L)
        p.update(act="swiglu_clamp", limit=float(_get(cfg, "swiglu_limit", 10.0)))
    elif fam in ("gpt_oss", "minimax_m3_vl", "openai_privacy_filter"):
        p.update(act="swiglu_oai", alpha=float(_get(cfg, "swiglu_alpha", 1.702)),
                 limit=float(_get(cfg, "swiglu_limit", 7.0)))
    else:
        act_key = "activation_function" if fam == "jetmoe" else "hidden_act"
        p["act"] = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh",
                    "gelu_new": "geglu_tanh"}[_get(cfg, act_key, "silu")]

    moe, router_name = _prefix(ck, fam, layer)
    p["router"] = ck.get(router_name)
    if fam == "jetmoe":  # JetMoeMoE: layer_output + self.bias
        p["out_bias"] = ck.get(moe + "bias")
    if fam in ("gpt_oss", "openai_privacy_filter"):
        p["router_bias"] = ck.get(moe + "router.bias")
    if fam == "ernie4_5_moe":
        p["sel_bias"] = ck.get(moe + "moe_statics.e_score_correction_bias").reshape(-1)  # [1, E] -> [E]
    if v3 or fam == "beam" or fam in _FAM_A:  # K-EXAONE's checkpoints keep it beside the router, not under it
        bias = moe + ("e_score_correction_bias" if fam in ("exaone_moe", "minimax_m2") else
                      "expert_bias" if fam == "hy_v3" else "gate.expert_bias" if fam == "bailing_hybrid"
                      else "gate.e_score_correction_bias")
        p["sel_bias"] = ck.get(bias)
    elif fam == "laguna":
        p["sel_bias"] = ck.get(moe + "experts.e_score_correction_bias")
    elif fam == "minimax_m3_vl":
        p["sel_bias"] = ck.get(moe + "e_score_correction_bias")
    elif fam == "afmoe":
        p["sel_bias"] = ck.get(moe + "expert_bias")
    elif fam == "kolibri1":
        p["sel_bias"] = ck.get(f"model.layers.{layer}.moe.router.expert_bias")
    if fam == "gpt_oss" and ck.has(moe + "experts.gate_up_proj_blocks"):
        gu = mxfp4_dequant(ck.get(moe + "experts.gate_up_proj_blocks"),
                           ck.get(moe + "experts.gate_up_proj_scales"))   # [E, 2I, H]
        p["w_gate"], p["w_up"] = gu[:, 0::2, :], gu[:, 1::2, :]
        p["w_down"] = mxfp4_dequant(ck.get(moe + "experts.down_proj_blocks"),
                                    ck.get(moe + "experts.down_proj_scales"))  # [E, H, I]
        b = ck.get(moe + "experts.gate_up_proj_bias")     # [E, 2I]
        p["biases"] = (b[:, 0::2], b[:, 1::2], ck.get(moe + "experts.down_proj_bias"))
    elif fam in ("gpt_oss", "llama4", "openai_privacy_filter", "aria"):
        fc = fam == "aria"  # AriaExperts as saved: fc1 / fc2, chunked like Llama-4's halves
        gu = ck.get(moe + ("experts.fc1.weight" if fc else "experts.gate_up_proj"))  # [E, H, 2I]
        dn = ck.get(moe + ("experts.fc2.weight" if fc else "experts.down_proj"))     # [E, I, H]
        if fam == "gpt_oss":
            p["w_gate"] = np.transpose(gu[:, :, 0::2], (0, 2, 1))
            p["w_up"] = np.transpose(gu[:, :, 1::2], (0, 2, 1))
            b = ck.get(moe + "experts.gate_up_proj_bias")     # [E, 2I]
            p["biases"] = (b[:, 0::2], b[:, 1::2], ck.get(moe + "experts.down_proj_bias"))
        else:  # Llama-4, the privacy filter: gate_up.chunk(2) -- gate the first I columns
            p["w_gate"] = np.transpose(gu[:, :, :I], (0, 2, 1))
            p["w_up"] = np.transpose(gu[:, :, I:], (0, 2, 1))
            if fam == "openai_privacy_filter":
                b = ck.get(moe + "experts.gate_up_proj_bias")  # [E, 2I], halves
                p["biases"] = (b[:, :I], b[:, I:], ck.get(moe + "experts.down_proj_bias"))
        p["w_down"] = np.transpose(dn, (0, 2, 1))
    elif ck.has(moe + "experts.gate_up_proj") or ck.has(moe + "input_linear.weight"):
        inl = ck.has(moe + "input_linear.weight") and not ck.has(moe + "experts.gate_up_proj")
        gu = ck.get(moe + ("input_linear.weight" if inl else "experts.gate_up_proj"))
        p["w_gate"], p["w_up"] = gu[:, :I, :], gu[:, I:, :]
        p["w_down"] = ck.get(moe + ("output_linear.weight" if inl else "experts.down_proj"))
    else:
        g, u, dn = (("w1", "w3", "w2") if fam in ("minimax", "minimax_m3_vl", "phimoe", "kimi_linear", "minimax_m2",
                                         "mistral_large4")
                    else ("gate_proj", "up_proj", "down_proj"))
        p["w_gate"] = np.stack([ck.get(f"{moe}experts.{e}.{g}.weight") for e in range(E)])
        p["w_up"] = np.stack([ck.get(f"{moe}experts.{e}.{u}.weight") for e in range(E)])
        p["w_down"] = np.stack([ck.get(f"{moe}experts.{e}.{dn}.weight") for e in range(E)])
    for k, shape in (("router", (E, H)), ("w_gate", (E, I, H)), ("w_up", (E, I, H)),
                     ("w_down", (E, H, I))):
        if tuple(p[k].shape) != shape:
            raise ValueError(f"layer {layer}: {k} has shape {p[k].shape}, expected {shape}")

    if fam in _FAM_A:
        key = "num_shared_experts" if fam in _KIMI_NAMES + ("hy_v3",) else "n_shared_experts"
        ns = 0 if fam == "minimax_m2" else cfg.get(key, cfg.get("n_shared_experts", 1) if fam in _KIMI_NAMES else 1)
        p["Is"] = int(ns or 0) * I
        s = moe + ("shared_mlp." if fam == "hy_v3" else "shared_experts.")
    elif fam == "dots3_note":
        # Dots3NoteTextMoE: Dots3NoteTextMLP(intermediate_size=shared_experts_intermediate_size *
        # n_shared_experts); the config class takes the legacy moe_shared_expert_intermediate_size
        width = cfg.get("moe_shared_expert_intermediate_size", cfg.get("shared_experts_intermediate_size", 1536))
        p["Is"], s = int(width) * int(cfg.get("n_shared_experts", 1) or 0), moe + "shared_experts."
    elif fam in ("deepseek_v2", "deepseek_v3", "mistral4", "mistral_large4", "deepseek_ocr2", "unlimited_ocr") + _V3_LIKE:
        key = "num_shared_experts" if fam == "exaone_moe" else "n_shared_experts"
        ns = cfg.get(key, {"deepseek_v2": 2, "deepseek_ocr2": 2, "unlimited_ocr": 2, "dots1": 0, "mimo_v2_flash": 0}.get(fam, 1))
        p["Is"] = int(ns or 0) * I
        s = moe + "shared_experts."
    elif fam == "llama4":
        p["Is"], s = I, moe + "shared_expert."
    elif fam == "hunyuan_v1_moe":
        p["Is"], s = I, moe + "shared_mlp."
    elif fam == "ernie4_5_moe":
        p["Is"], s = int(_get(cfg, "moe_num_shared_experts", 2)) * I, moe + "shared_experts."
    elif fam == "aria":  # AriaSharedExpertsMLP: intermediate_size * moe_num_shared_experts
        p["Is"], s = int(_get(cfg, "moe_num_shared_experts", 2)) * I, moe + "shared_experts."  # HunYuanMoEV1MLP: intermediate_size, as the experts
    elif fam in ("qwen3_5_moe", "qwen3_next", "qwen4_exp"):
        p["Is"], s = int(cfg.get("shared_expert_intermediate_size") or 0), moe + "shared_expert."
        p["shared_gated"] = True
    elif fam == "afmoe":
        p["Is"], s = int(_get(cfg, "num_shared_experts", 2)) * I, moe + "shared_experts."
    elif fam == "minimax_m3_vl":
        p["Is"], s = int(cfg.get("shared_intermediate_size") or 0), moe + "shared_experts."
    elif fam in ("laguna", "kolibri1", "flint", "lara_mini"):
        p["Is"] = int(cfg.get("shared_expert_intermediate_size") or 0)
        s = moe + ("shared_experts." if fam == "kolibri1" else "shared_expert.")
    elif fam in ("granitemoeshared", "granitemoehybrid"):
        # GraniteMoeSharedDecoderLayer: block_sparse_moe(x) + shared_mlp(x); the MLP's
        # input_linear output is chunked in two: act(first half) * second half
        Is = int(_get(cfg, "shared_intermediate_size", 0 if fam == "granitemoeshared" else 1024))
        if Is:
            base = f"model.layers.{layer}.shared_mlp."
            gu = ck.get(base + "input_linear.weight")  # [2 I_s, H]
            p.update(Is=Is, s_gate=gu[:Is], s_up=gu[Is:], s_down=ck.get(base + "output_linear.weight"))
        return p
    if p["Is"]:
        names = ("w1", "w3", "w2") if fam == "mistral_large4" else ("gate_proj", "up_proj", "down_proj")
        p["s_gate"] = ck.get(s + names[0] + ".weight")
        p["s_up"] = ck.get(s + names[1] + ".weight")
        p["s_down"] = ck.get(s + names[2] + ".weight")
        if p["shared_gated"]:
            p["s_expert_gate"] = ck.get(moe + "shared_expert_gate.weight")  # [1, H]
    return p


# e2m1 values by 4-bit code (OCP MX: bit 3 the sign; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6)
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4_dequant(blocks, scales):
    """gpt-oss MXFP4: blocks [E, N, K/32, 16] uint8, scales [E, N, K/32] uint8 (E8M0) ->
    w [E, N, K] float64, w[e, n, 32 g + j] = e2m1(code j of group g) * 2^(scale[e, n, g] - 127),
    code 2b in the low nibble of byte b, code 2b + 1 in the high nibble. Exact in float64."""
    E, N, G, B = blocks.shape
    if B != 16 or tuple(scales.shape) != (E, N, G):
        raise ValueError(f"MXFP4 blocks {blocks.shape} / scales {scales.shape}: expected [E, N, G, 16] / [E, N, G]")
    codes = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(E, N, G, 32)
    w = _E2M1[codes] * np.exp2(scales.astype(np.float64) - 127.0)[..., None]
    return w.reshape(E, N, G * 32)


def silu(v):
    return v / (1.0 + np.exp(-v))


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def expert(p, x, e):
    """x [n, H] -> [n, H] through expert e, with the family's activation and biases (a
    non-gated activation, relu / relu2 / gelu / gelu_tanh, reads no w_gate: h = act(W_up x))."""
    u = x @ p["w_up"][e].T
    act = p.get("act")
    if act in ("relu", "relu2", "gelu", "gelu_tanh"):
        if act == "relu":
            h = np.maximum(u, 0.0)
        elif act == "relu2":
            h = np.maximum(u, 0.0) ** 2
        elif act == "gelu":
            h = 0.5 * u * (1.0 + np.vectorize(math.erf)(u / math.sqrt(2.0)))
        else:
            h = 0.5 * u * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))
        return h @ p["w_down"][e].T
    g = x @ p["w_gate"][e].T
    if p.get("biases") is not None:
        g, u = g + p["biases"][0][e], u + p["biases"][1][e]
    if p.get("act") == "swiglu_oai":
        lim, alpha = p["limit"], p["alpha"]
        g = np.minimum(g, lim)
        u = np.clip(u, -lim, lim)
        h = (u + 1.0) * (g * sigmoid(alpha * g))
    elif p.get("act") == "swiglu_clamp":
        lim = p["limit"]
        h = silu(np.minimum(g, lim)) * np.clip(u, -lim, lim)
    elif p.get("act") == "swiglu_postclamp":  # Step3p7Experts._apply_gate: the clamp after the SiLU
        lim = p["limit"]
        h = np.minimum(silu(g), lim) * np.clip(u, -lim, lim)
    elif p.get("act") == "swiglu_softcap":  # Inkling2SoftcappedSwiGLU: the sigmoid of the raw gate
        cg, cu = p["cg"], p["cu"]
        h = (np.tanh(g / cg) * cg) * sigmoid(g) * (np.tanh(u / cu) * cu)
    elif p.get("act") == "geglu":
        h = 0.5 * g * (1.0 + np.vectorize(math.erf)(g / math.sqrt(2.0))) * u
    elif p.get("act") == "geglu_tanh":
        h = 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3))) * u
    else:
        h = silu(g) * u
    y = h @ p["w_down"][e].T
    if p.get("biases") is not None:
        y = y + p["biases"][2][e]
    return y


def swiglu(x, wg, wu, wd):
    """x [n, H] -> [n, H]: W_down (silu(W_gate x) * (W_up x))."""
    return (silu(x @ wg.T) * (x @ wu.T)) @ wd.T


def softmax(l):
    m = l.max(axis=-1, keepdims=True)
    e = np.exp(l - m)
    return e / e.sum(axis=-1, keepdims=True)


def topk_lower_id(scores, K):
    """Per row, the K largest scores in descending order, ties to the lower index."""
    # A stable sort of -scores keeps equal scores in index order.
    return np.argsort(-scores, axis=-1, kind="stable")[:, :K]


def sparsemixer(logits, eps):
    """Phi-MoE's sparsemixer in eval mode (arXiv 2409.12136; transformers' phimoe
    `sparsemixer`, training False): two rounds; round r takes the largest remaining logit m
    (ties to the lower id), masks every expert with (m - l) / max(|l|, m) > 2 eps and every
    expert already taken, and weights the pick by the softmax of the unmasked logits."""
    T, E = logits.shape
    ids = np.zeros((T, 2), dtype=np.int64)
    w = np.zeros((T, 2))
    for t in range(T):
        l = logits[t]
        taken = []
        for r in range(2):
            rest = np.array([e not in taken for e in range(E)])
            cand = np.where(rest, l, -np.inf)
            best = int(np.argmax(cand))  # first maximum: the lower id
            m = l[best]
            masked = ((m - l) / np.maximum(np.abs(l), m) > 2.0 * eps) | ~rest
            g = np.where(masked, -np.inf, l)
            ids[t, r] = best
            w[t, r] = softmax(g[None])[0, best]
            taken.append(best)
    return ids, w


def route(p, x):
    """-> (logits [T, E], the selection key [T, E] after group masking ("probs" for the
    softmax families), ids [T, K], weights [T, K] before routed_scaling_factor)."""
    logits = x @ p["router"].T  # [T, E]
    if p.get("router_bias") is not None:
        logits = logits + p["router_bias"]
    scoring = p.get("scoring", "softmax")
    if scoring == "sparsemixer":
        ids, w = sparsemixer(logits, p["eps"])
        return logits, logits, ids, w
    if scoring == "softmax":
        scores = softmax(logits)
    elif scoring == "sigmoid":
        scores = sigmoid(logits)
    elif scoring == "sqrtsoftplus":           # DeepSeek-V4: sqrt(log(1 + e^l))
        scores = np.sqrt(np.logaddexp(0.0, logits))
    else:
        scores = logits                       # top-k first, on the logits
    key = scores if p.get("sel_bias") is None else scores + p["sel_bias"]
    G = p.get("n_group", 1)
    if G > 1:
        T, E = key.shape
        kg = key.reshape(T, G, E // G)
        if p["group_score"] == "top2_sum":
            srt = -np.sort(-kg, axis=-1)
            gs = srt[:, :, 0] + srt[:, :, 1]
        else:
            gs = kg.max(axis=-1)
        kept = topk_lower_id(gs, p["topk_group"])
        mask = np.zeros((T, G), dtype=bool)
        np.put_along_axis(mask, kept, True, axis=-1)
        key = np.where(np.repeat(mask, E // G, axis=-1), key, -np.inf)
    ids = topk_lower_id(key, p["K"])
    if scoring == "topk_softmax":
        w = softmax(np.take_along_axis(logits, ids, axis=-1))
    elif scoring == "topk_sigmoid":
        w = sigmoid(np.take_along_axis(logits, ids, axis=-1))
    else:
        w = np.take_along_axis(scores, ids, axis=-1)
    if p["renormalize"] and p.get("renorm_p") not in (None, 1.0):  # DBRX: torch.norm(w, p)
        q = p["renorm_p"]
        n = np.abs(w).max(axis=-1, keepdims=True) if np.isinf(q) else (np.abs(w) ** q).sum(-1, keepdims=True) ** (1 / q)
        w = w / n
    elif p["renormalize"]:  # LFM2-MoE: + 1e-6; Cohere2-MoE: the sum alone
        w = w / (w.sum(axis=-1, keepdims=True) + p.get("renorm_eps", 1e-20))
    return logits, key, ids, w


def moe_forward(p, x):
    """x [T, H] (any float dtype, widened to float64) -> dict of float64/int arrays."""
    x = np.asarray(x, dtype=np.float64)
    logits, probs, ids, w = route(p, x)
    T, H = x.shape
    out = np.zeros((T, H))
    for e in range(p["E"]):
        rows, ks = np.nonzero(ids == e)
        if rows.size == 0:
            continue
        if p.get("on_input"):  # Llama-4: the weight scales the expert input, once
            np.add.at(out, rows, expert(p, w[rows, ks][:, None] * x[rows], e))
        else:
            np.add.at(out, rows, w[rows, ks][:, None] * expert(p, x[rows], e))
    for e in range(p["E"], p["E"] + p.get("Z", 0)):  # LongCat-Flash's identity experts: w * x
        rows, ks = np.nonzero(ids == e)
        np.add.at(out, rows, w[rows, ks][:, None] * x[rows])
    out *= p.get("scale", 1.0)
    if p["Is"]:
        gate = 1.0
        if p.get("shared_gated", p.get("family") == "qwen2_moe"):
            gate = 1.0 / (1.0 + np.exp(-(x @ p["s_expert_gate"].T)))  # [T, 1]
        if p.get("s_act"):  # HY-V4: the shared expert's own activation (HYV4MLP: ACT2FN[hidden_act])
            sh = {"w_gate": None if p["s_gate"] is None else p["s_gate"][None], "w_up": p["s_up"][None],
                  "w_down": p["s_down"][None], "act": p["s_act"], "limit": p.get("s_limit")}
            out += gate * expert(sh, x, 0)
        elif p.get("family") == "minimax_m3_vl":  # MiniMaxM3VLDenseMLP: the experts' clamped SwiGLU
            sh = {"w_gate": p["s_gate"][None], "w_up": p["s_up"][None], "w_down": p["s_down"][None],
                  "act": p["act"], "alpha": p["alpha"], "limit": p["limit"]}
            out += gate * expert(sh, x, 0)
        elif p.get("act") == "swiglu_clamp":  # GLM-5-Next's shared expert clamps as its routed ones
            lim = p["limit"]
            g, u = x @ p["s_gate"].T, x @ p["s_up"].T
            out += gate * ((silu(np.minimum(g, lim)) * np.clip(u, -lim, lim)) @ p["s_down"].T)
        elif p.get("average") is not None:  # Cohere2-MoE: (routed + shared) / 2, or routed + shared
            sh = {"w_gate": p["s_gate"][None], "w_up": p["s_up"][None], "w_down": p["s_down"][None], "act": p["act"]}
            out += expert(sh, x, 0)
            if p["average"]:
                out /= 2.0
        else:
            out += gate * swiglu(x, p["s_gate"], p["s_up"], p["s_down"])
    if p.get("out_bias") is not None:
        out += p["out_bias"]
    if p.get("out_norm") is not None:  # A.X-K1: AXK1RMSNorm of routed + shared, last
        out = p["out_norm"] * (out / np.sqrt((out * out).mean(axis=-1, keepdims=True) + p["norm_eps"]))
    return {"output": out, "topk_ids": ids.astype(np.int32), "topk_weights": w,
            "router_logits": logits, "probs": probs}


def routing_margin(probs, K):
    """Smallest gap between consecutive sorted probabilities among the first min(K+1, E) of
    each row: a top-k is reproducible in f32 only where this is well above f32 rounding."""
    s = -np.sort(-probs, axis=-1)
    n = min(K + 1, s.shape[-1])
    if n < 2:
        return np.full(s.shape[0], np.inf)
    return (s[:, : n - 1] - s[:, 1:n]).min(axis=-1)


def run_checkpoint(ckpt_dir, layer, hidden_states, expert_set=None):
    ck = Checkpoint(ckpt_dir)
    ck.expert_set = expert_set  # ERNIE-4.5-VL's modality (layer_params_ernie_vl)
    return moe_forward(layer_params(ck, layer), hidden_states)
