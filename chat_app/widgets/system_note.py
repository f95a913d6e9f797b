"""SystemNote: what a slash command says back (/show, /stats, the /theme list, a refusal),
shown in the conversation between the messages, where it scrolls with them.

Contract: a note is the app talking to the user, not part of the chat: it is never written to
the store, never sent to the model, never exported, and it goes when the screen is cleared
(/clear, Ctrl+N, another chat). It is plain text (chat_app.labels: what it echoes, a system
prompt, a path, a model's name, is never parsed as markup), dim with a rule at its left; an
error or a warning colours the rule. Notices that only pass (a file exported, a model loaded)
stay toasts.
"""

from __future__ import annotations

from textual.widgets import Static

from chat_app.labels import plain, printable


class SystemNote(Static):
    def __init__(self, text: str, severity: str = "information") -> None:
        super().__init__(plain(text))
        self.text = printable(text)  # as shown (and copied)
        self.severity = severity
        self.add_class(f"-{severity}")
