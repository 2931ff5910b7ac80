"""CDS Hooks 2.0: trial matches as cards in the EHR's patient view, read from decisions already made
(`serving.py`), the EHR authenticated by its signed JWT (`client_jwt.py`), feedback into the audit
chain. Models `protocol.py`, routes `router.py`."""
