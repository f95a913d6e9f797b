"""Command-line tools on top of the library: bench, train, datagen, eval.
"""
