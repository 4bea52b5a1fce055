"""Parley's engine: models, tokenizers, the KV cache and the step loop. Never imports Qt.

Call direction (each arrow is a method call on the next owner; nothing reaches past it):
Engine (engine.py: loop + public API) → ModelHost (host.py; local_host.py / remote.py)
→ ModelRuntime (runtime.py) → Batcher (batcher.py: schedule, step, sample, commit)
→ runner (runner.py / cuda_graphs.py, owning its StepInputs) → CausalLM (models/) → cache (cache/) → kernels.
"""
