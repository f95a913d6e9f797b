"""The model's math, its caches and its weight forms (dense, quantized: one Linear class per kernel).
Imports only tinyllm.kernels.
"""
