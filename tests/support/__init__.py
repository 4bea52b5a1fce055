"""Test support: tiny random-weight models saved as Hugging Face folders and GGUF files."""
