"""`parley serve`: an OpenAI-compatible HTTP API on the engine (Starlette + uvicorn)."""
