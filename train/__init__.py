"""train: LoRA distillation of the parser and value-miner students (TRL + PEFT)."""
