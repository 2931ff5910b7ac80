"""`/healthz`, `/readyz` (no key) and `/metrics` (audit role): `router.py`."""
