"""Verdict on-site, under one import namespace.

| import name          | folder          | what it is                                                   |
|----------------------|-----------------|--------------------------------------------------------------|
| `verdict.core`       | `verdict_core/` | the deterministic decision core (Z3 / MaxSMT), no LLM        |
| `verdict.data_gen`   | `data_gen/`     | the formalizer runtime (shared with serve) + teacher pipeline |
| `verdict.train`      | `train/`        | LoRA distillation of the students (TRL + PEFT)               |
| `verdict.slurm`      | `slurm/`        | job scripts rendered from configs, submitted with sbatch     |
| `verdict.serve`      | `serve/`        | vLLM students behind the FastAPI matching service            |
| `verdict.bench`      | `bench/`        | local vs API formalizers on public benchmarks                |
| `verdict.configs`    | `configs/`      | the shipped configs (package data)                           |
| `verdict.examples`   | `examples/`     | sample cases and demo records (package data)                 |
| `verdict.cli`        | `verdict/`      | the `verdict` application over all of them                   |
| `verdict.demo`       | `verdict/`      | `verdict demo`: the whole on-site story (uses every part)     |
"""
