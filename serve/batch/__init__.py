"""Offline screening as SLURM arrays (`verdict match ...`): every patient against every trial, one
vLLM and the matching service in-process per shard.

    cli.py          the `verdict match` commands (batch, worker, merge, status, rescreen)
    match_batch.py  the plan, the shards, the results (one line per pair) and their merge
"""
