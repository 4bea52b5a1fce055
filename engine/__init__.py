"""Parley's engine: models, tokenizers, the KV cache and the step loop. Never imports Qt."""
