"""`POST /v1/trials` (parse or upload a trial program) and `GET /v1/trials/{id}`: `router.py`; the
logic is `MatchingService.register_trial` / `get_trial` (serve/serving.py)."""
