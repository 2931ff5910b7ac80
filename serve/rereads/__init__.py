"""Re-reading a decision's chart (issue 23): a reviewer asks for an exhaustive read of some atoms,
or for the mining a staged decision left incomplete; the answer is a new decision with lineage, as
a review's is.

    protocol.py   RereadRequest / RereadResponse
    serving.py    RereadService (serve/dependencies.py: Rereads); the reading itself: reviews/reading.py
    router.py     POST /v1/decisions/{id}/rereads
"""
