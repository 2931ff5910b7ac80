"""The shipped configs, as package data (`verdict.configs`): found by `verdict.core.configs` after a
site's own `--config-dir` / `$VERDICT_CONFIG_DIR`. No code lives here."""
