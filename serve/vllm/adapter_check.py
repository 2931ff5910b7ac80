"""Does vLLM serve an adapter the way PEFT/transformers runs it? A golden set of chat records goes
through both, greedy, and the outputs are compared character for character (and as JSON).

vLLM has had LoRA bugs where an adapter loads without error yet generates differently (unsupported
target modules skipped, scaling variants ignored, dtype downcasts); this check catches them before
deployment. Golden records are the SFT layout (`{"messages": [...], "task": ..., "record_id": ...}`);
a trailing assistant message is the reference output, reported as `teacher_match`. With several
adapters, a record goes to the adapter named like its `task`; with one adapter, every record does.

The transformers side runs in float32 unless the vLLM config pins another dtype: set `vllm.dtype:
float32` for a like-for-like comparison on CPU (vLLM's `auto` downcasts float32 models to bfloat16).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field
from verdict.core.configs import StrictModel
from verdict.core.progress import Progress
from verdict.train.peft_quiet import peft_quietly

from ..errors import AdapterCheckError
from .config import VLLMConfig
from .server import VLLMServer


class AdapterCheckConfig(StrictModel):
    golden: str = Field(description="JSONL of chat records")
    adapters: list[str] | None = Field(None, description="adapter names to check; default: all in the config")
    limit: int | None = Field(None, ge=1)
    max_tokens: int = Field(512, ge=1)
    min_agreement: float = Field(1.0, ge=0, le=1)
    base_url: str | None = Field(None, description="a running server; default: start one from the config")


class RecordResult(BaseModel):
    record_id: str
    agree: bool
    json_equal: bool
    teacher_match: bool | None
    first_difference: int | None = Field(description="index of the first differing character; null if equal")
    vllm_output: str
    hf_output: str


class AdapterAgreement(BaseModel):
    adapter: str
    adapter_path: str
    total: int
    agree: int
    json_equal: int
    teacher_match: int
    agreement: float
    records: list[RecordResult]


class AdapterCheckResult(BaseModel):
    base_model: str
    dtype: str
    adapters: list[AdapterAgreement]
    min_agreement: float
    passed: bool


def load_golden(path: str | Path, limit: int | None = None) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise AdapterCheckError(f"golden set {p} not found")
    rows, problems = [], []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            problems.append(f"{p.name}:{n}: not valid JSON")
            continue
        msgs = row.get("messages") if isinstance(row, dict) else None
        if (
            not isinstance(msgs, list)
            or not msgs
            or not all(isinstance(m, dict) and "role" in m and "content" in m for m in msgs)
        ):
            problems.append(f"{p.name}:{n}: needs 'messages', a list of {{role, content}}")
            continue
        row.setdefault("record_id", f"line-{n}")
        rows.append(row)
    if problems:
        raise AdapterCheckError(f"golden set {p.name} is invalid", problems[:20])
    if not rows:
        raise AdapterCheckError(f"golden set {p.name} has no records")
    return rows[:limit] if limit else rows


def split_prompt(row: dict) -> tuple[list[dict], str | None]:
    msgs = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
    if msgs[-1]["role"] == "assistant":
        return msgs[:-1], msgs[-1]["content"]
    return msgs, None


def first_difference(a: str, b: str) -> int | None:
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _json_equal(a: str, b: str) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False


class TransformersRunner:
    """Greedy generation with the base model + one PEFT adapter at a time."""

    def __init__(self, base_model: str, dtype: str):
        import torch  # heavy optional dependency: torch (train extra)

        # heavy optional dependency: transformers (train extra)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype, torch.float32)
        self.tok = AutoTokenizer.from_pretrained(base_model)
        # On a GPU node the reference runs on the GPU (vLLM is stopped before it starts); on CPU as before.
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.base = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch_dtype).to(self.device)
        self.base.eval()
        gen = self.base.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tok.eos_token_id
        self.eos = eos if isinstance(eos, list) else [eos]

    def generate(self, adapter_path: str, prompts: list[list[dict]], max_tokens: int) -> list[str]:
        import torch  # heavy optional dependency: torch (train extra)
        from peft import PeftModel  # heavy optional dependency: peft (train extra)

        with peft_quietly():
            model = PeftModel.from_pretrained(self.base, adapter_path)
        model.eval()
        outs = []
        try:
            for msgs in prompts:
                enc = self.tok.apply_chat_template(
                    msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True
                ).to(self.device)
                with torch.no_grad():
                    ids = model.generate(
                        **enc,
                        max_new_tokens=max_tokens,
                        do_sample=False,
                        eos_token_id=self.eos,
                        pad_token_id=self.tok.pad_token_id,
                    )
                outs.append(self.tok.decode(ids[0, enc["input_ids"].shape[1] :], skip_special_tokens=True))
        finally:
            self.base = model.unload()  # the base model back, without this adapter's layers
        return outs


def vllm_generate(base_url: str, adapter: str, prompts: list[list[dict]], max_tokens: int) -> list[str]:
    """Greedy and unconstrained: the adapter's own behaviour, as the transformers side sees it."""
    import httpx  # heavy optional dependency: httpx (serve extra)

    outs = []
    with httpx.Client(base_url=base_url, timeout=600, trust_env=False) as http:
        for msgs in prompts:
            r = http.post(
                "/chat/completions",
                json={"model": adapter, "messages": msgs, "max_tokens": max_tokens, "temperature": 0.0},
            )
            if r.status_code != 200:
                raise AdapterCheckError(
                    f"vLLM answered HTTP {r.status_code} for adapter '{adapter}': {r.text[:200]}"
                )
            outs.append(r.json()["choices"][0]["message"]["content"] or "")
    return outs


def run_adapter_check(
    config: VLLMConfig, check: AdapterCheckConfig, progress: Progress = lambda m: None
) -> AdapterCheckResult:
    rows = load_golden(check.golden, check.limit)
    names = check.adapters or list(config.adapters)
    unknown = [a for a in names if a not in config.adapters]
    if unknown:
        raise AdapterCheckError(f"adapter(s) {unknown} not in the serve config (has {list(config.adapters)})")
    if not names:
        raise AdapterCheckError("the serve config has no adapters to check")
    per_adapter = {a: rows if len(names) == 1 else [r for r in rows if r.get("task") == a] for a in names}
    empty = [a for a, rs in per_adapter.items() if not rs]
    if empty:
        raise AdapterCheckError(
            f"no golden records with task {empty}: records go to the adapter named like "
            "their `task` when several adapters are checked"
        )

    server = None
    base_url = check.base_url
    if base_url is None:
        progress("starting vLLM for the check")
        server = VLLMServer(config).start()
        base_url = server.base_url
    try:
        vllm_out = {}
        for a in names:
            progress(f"vLLM: {len(per_adapter[a])} records through '{a}'")
            vllm_out[a] = vllm_generate(
                base_url, a, [split_prompt(r)[0] for r in per_adapter[a]], check.max_tokens
            )
    finally:
        if server is not None:
            server.stop()

    runner = TransformersRunner(config.model, config.dtype)
    results = []
    for a in names:
        progress(f"transformers: {len(per_adapter[a])} records through '{a}'")
        prompts = [split_prompt(r) for r in per_adapter[a]]
        hf_out = runner.generate(str(config.adapter_dirs()[a]), [p for p, _ in prompts], check.max_tokens)
        recs = []
        for row, (_, ref), v, h in zip(per_adapter[a], prompts, vllm_out[a], hf_out):
            recs.append(
                RecordResult(
                    record_id=str(row["record_id"]),
                    agree=v == h,
                    json_equal=_json_equal(v, h),
                    teacher_match=None if ref is None else v == ref,
                    first_difference=first_difference(v, h),
                    vllm_output=v,
                    hf_output=h,
                )
            )
        agree = sum(r.agree for r in recs)
        results.append(
            AdapterAgreement(
                adapter=a,
                adapter_path=str(config.adapter_dirs()[a]),
                total=len(recs),
                agree=agree,
                json_equal=sum(r.json_equal for r in recs),
                teacher_match=sum(bool(r.teacher_match) for r in recs),
                agreement=agree / len(recs),
                records=recs,
            )
        )
    return AdapterCheckResult(
        base_model=config.model,
        dtype=config.dtype,
        adapters=results,
        min_agreement=check.min_agreement,
        passed=all(r.agreement >= check.min_agreement for r in results),
    )
