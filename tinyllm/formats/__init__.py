"""Checkpoint formats (tinyllm's own, Hugging Face, GGUF) on one skeleton, and the one load rule.
Imports only the layers below: kernels, text, core.
"""
