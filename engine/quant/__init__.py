"""Quantized weights: GGUF blocks read without fp32 (gguf_blocks), the CPU runtime formats (weight), the conversion (from_gguf)."""
