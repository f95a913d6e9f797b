"""The bottom layer: the C++ CPU kernels and their build, the Triton kernels, the switches they read.
Imports nothing else of tinyllm.
"""
