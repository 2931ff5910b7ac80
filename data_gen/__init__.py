"""data_gen: the teacher pipeline (API models -> checked formalizer outputs -> SFT datasets)."""
