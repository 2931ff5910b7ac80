"""`POST /v1/trials` (parse or upload a trial program) and `GET /v1/trials/{id}`: models
`protocol.py`, logic `serving.py` (`TrialService`), routes `router.py`."""
