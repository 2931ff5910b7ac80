"""`POST /v1/match` and `POST /v1/match/batch`: `router.py`; the logic is `MatchingService.match` /
`match_batch` (serve/serving.py)."""
