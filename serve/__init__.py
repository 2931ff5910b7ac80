"""serve: vLLM-served students behind the FastAPI matching service."""
