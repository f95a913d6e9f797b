"""Decoding: sampling, the eager reference generate(), graphed and native decode steps, the engine.
Imports only the layers below: kernels, text, core, formats.
"""
