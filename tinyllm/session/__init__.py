"""A chat session (conversation, decode runner, step policy) and its typed process protocol.
Imports only the layers below.
"""
