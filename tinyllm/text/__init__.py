"""The bottom layer: tokenizers and chat templates. Torch-free; imports nothing else of tinyllm.
"""
