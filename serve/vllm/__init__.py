"""vLLM process management: the students' server and what it needs.

server.py          VLLMServer: start, wait until ready, stop (and how a dead one ended)
config.py          VLLMConfig: base model, adapters, memory, the port
process_reaper.py  the watcher that stops a vLLM whose parent died
gpu_sizing.py      GPU memory a config needs (weights + adapters + KV cache)
adapter_check.py   the golden set through vLLM and through PEFT: the adapters served as trained
slurm_job.py       a serve config as a SLURM job (`verdict serve slurm-job`: the job runs vLLM)
"""
