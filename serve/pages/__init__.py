"""The browser side of the service: the login session (`session.py`) and the HTML page routes
(`router.py`: login, logout, the clinician page and its review forms)."""
