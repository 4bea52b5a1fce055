"""An OpenAI-compatible HTTP API (Starlette + uvicorn) over one engine; `parley serve` (cli/serve.py) starts it."""
