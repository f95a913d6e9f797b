"""StreamedMarkdown: Textual's Markdown, but what streams in once it is detached is dropped.

Contract: `mount()` (which `append()` and a block's update call, also from a MarkdownStream's
background task) mounts nothing once the widget is not attached: the app has begun to exit
(Textual's `is_attached` is False everywhere from `exit()` on) or the reply was removed.
Textual's own mount raises MountError then ("Can't mount widget(s) before Markdown() is
mounted"), from the stream's task; quitting mid-reply printed that traceback (issue 31).
Nothing else differs. Imported with the first reply (Markdown's import is not free).
"""

from __future__ import annotations

from textual.widget import AwaitMount, Widget
from textual.widgets import Markdown


class StreamedMarkdown(Markdown):
    def mount(self, *widgets: Widget, before: int | str | Widget | None = None,
              after: int | str | Widget | None = None) -> AwaitMount:
        if not self.is_attached:  # nothing is left to show it in
            return AwaitMount(self, [])
        return super().mount(*widgets, before=before, after=after)
