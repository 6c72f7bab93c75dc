"""Attention backends beyond Hugging Face's own: xFormers and our Triton kernel, by module swap."""
