"""How much GPU memory a vLLM serve config needs: one stated formula, used by the preflight of
`verdict serve vllm|up` and by the sizing table in docs/serve.md (`verdict serve sizing`).

    needed = weights + adapters + kv_cache_per_token x tokens
    weights            = parameters x bytes per value of the served dtype
    adapters           = max_loras x sum over LoRA layers of rank x (in + out) x bytes (vLLM keeps one
                         slot per adapter at --max-lora-rank)
    kv_cache_per_token = 2 (K and V) x layers x kv_heads x head_dim x bytes
    tokens             = max_model_len x concurrent sequences (max_num_seqs)

Parameters are counted from the model's config.json (decoder-only transformer: embeddings, attention
with grouped KV heads and biases as Qwen2 has them, gated MLP, norms). Not counted: activations,
CUDA graphs and the CUDA context (vLLM's `gpu_memory_utilization` leaves that headroom). This is
an estimate from the architecture, documented, not measured here (no GPU in CI).
"""

from __future__ import annotations

from pydantic import BaseModel

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "half": 2, "float": 4}
# vLLM's default number of concurrent sequences (--max-num-seqs) when a config leaves it unset
VLLM_DEFAULT_MAX_NUM_SEQS = 256
# Qwen2.5-7B-Instruct's config.json (the architecture values only): the docs' sizing table.
QWEN25_7B = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
PAPER_LORA = {"r": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


class Estimate(BaseModel):
    """GPU memory of one configuration, in bytes, by term of the formula."""

    parameters: int
    weights: int
    adapters: int
    kv_per_token: int
    tokens: int

    @property
    def kv_cache(self) -> int:
        return self.kv_per_token * self.tokens

    @property
    def total(self) -> int:
        return self.weights + self.adapters + self.kv_cache

    def text(self) -> str:
        return (
            f"{self.total / GIB:.1f} GiB = weights {self.weights / GIB:.1f} GiB "
            f"({self.parameters / 1e9:.2f} B parameters) + adapters {self.adapters / GIB:.2f} GiB "
            f"+ KV cache {self.kv_per_token / 1024:.0f} KiB/token x {self.tokens} tokens "
            f"({self.kv_cache / GIB:.1f} GiB)"
        )


def dtype_bytes(dtype: str, model_config: dict) -> int:
    name = model_config.get("torch_dtype", "bfloat16") if dtype == "auto" else dtype
    return DTYPE_BYTES.get(str(name), 2)


def _dims(mc: dict) -> tuple[int, int, int, int, int, int]:
    h, layers = int(mc["hidden_size"]), int(mc["num_hidden_layers"])
    heads = int(mc["num_attention_heads"])
    kv_heads = int(mc.get("num_key_value_heads") or heads)
    head_dim = int(mc.get("head_dim") or h // heads)
    return h, int(mc["intermediate_size"]), layers, heads, kv_heads, head_dim


def parameter_count(mc: dict) -> int:
    h, inter, layers, heads, kv_heads, head_dim = _dims(mc)
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = h * q + q + 2 * (h * kv + kv) + q * h  # q, k, v with biases (Qwen2), o without
    mlp = 3 * h * inter  # gate, up, down
    per_layer = attention + mlp + 2 * h  # two RMSNorms
    embed = int(mc["vocab_size"]) * h
    head = 0 if mc.get("tie_word_embeddings") else embed
    return layers * per_layer + embed + head + h


def module_shape(mc: dict, module: str) -> tuple[int, int]:
    """(in, out) features of a LoRA target module of the architecture."""
    h, inter, _, heads, kv_heads, head_dim = _dims(mc)
    shapes = {
        "q_proj": (h, heads * head_dim),
        "k_proj": (h, kv_heads * head_dim),
        "v_proj": (h, kv_heads * head_dim),
        "o_proj": (heads * head_dim, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }
    return shapes.get(module, (h, h))


def estimate(
    mc: dict,
    dtype: str = "auto",
    adapters: list[dict] | None = None,
    max_model_len: int = 4096,
    concurrency: int = VLLM_DEFAULT_MAX_NUM_SEQS,
    max_lora_rank: int | None = None,
) -> Estimate:
    """The formula above. ``adapters``: their adapter_config.json dicts (`r`, `target_modules`)."""
    b = dtype_bytes(dtype, mc)
    _, _, layers, _, kv_heads, head_dim = _dims(mc)
    params = parameter_count(mc)
    lora = 0
    for a in adapters or []:
        rank = max_lora_rank or int(a.get("r") or 0)
        modules = a.get("target_modules") or []
        if isinstance(modules, str):  # PEFT allows a regex; count the attention projections
            modules = PAPER_LORA["target_modules"]
        lora += layers * sum(rank * sum(module_shape(mc, m)) for m in modules) * b
    return Estimate(
        parameters=params,
        weights=params * b,
        adapters=lora,
        kv_per_token=2 * layers * kv_heads * head_dim * b,
        tokens=max_model_len * concurrency,
    )


def sizing_table(concurrency: list[int], max_model_len: int = 4096) -> str:
    """docs/serve.md's table: Qwen2.5-7B in bf16 with two rank-32 LoRA adapters, by concurrency."""
    rows = [
        "| concurrent sequences | weights | adapters | KV cache | total |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in concurrency:
        e = estimate(QWEN25_7B, "bfloat16", [PAPER_LORA, PAPER_LORA], max_model_len, n)
        rows.append(
            f"| {n} | {e.weights / GIB:.1f} GiB | {e.adapters / GIB:.2f} GiB | {e.kv_cache / GIB:.1f} GiB "
            f"| {e.total / GIB:.1f} GiB |"
        )
    return "\n".join(rows)
