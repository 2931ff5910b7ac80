"""`POST /v1/match` and `POST /v1/match/batch`: models `protocol.py`, logic `serving.py`
(`MatchingService`; the batch's stream: serve/pairs.py), routes `router.py`."""
