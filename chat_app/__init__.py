"""tinyllm-chat: a Textual TUI for chatting with small local models (see chat_app.__main__).

Importing this package imports nothing else: `tinyllm-chat --help` stays fast.
"""
