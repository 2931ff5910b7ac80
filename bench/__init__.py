"""bench: benchmarks of the core and of local vs API formalizers."""
