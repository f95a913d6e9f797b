"""The shipped checkpoints, one folder each (models/<name>/README.md is its model card).

This folder stays at the top of the repository; a wheel installs it as the package
`tinyllm_models` (pyproject.toml's package-dir), with each folder's config, weights,
tokenizer and card and nothing else, so an installed tinyllm-chat opens its default model
without a clone. Nothing here is imported for its code: the package only locates the files.
"""
