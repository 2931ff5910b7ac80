"""`/healthz`, `/readyz` (no key) and `/metrics` (audit role): models `protocol.py`, readiness
`serving.py` (`HealthService`), routes `router.py`."""
