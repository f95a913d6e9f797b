"""LoadProgress: one line above the status bar while a model opens.

`start(name)` shows it: "Opening NAME…" and a bar that pulses until the model's loader reports
(the child process imports torch first). `advance(done, total)` makes the bar determinate:
tensors read of all. `kernels(step, done, total, seconds, compiling)` shows the CPU kernels' step
(the steps of tinyllm.session.session_protocol.Progress): while they build (the first launch where no
prebuilt library fits), KERNELS_BUILDING, a pulsing bar (the two files that include torch's headers
take most of the time, so the files compiled are no measure of the time left) and "DONE/TOTAL files
· compiling NAME +N · N s" (the first file a compiler is on now, and how many more: the count
stands still for seconds while both big ones compile); then that they were
found built ("CPU kernels: cached"), were built, or failed to build. `finish()` hides it; the
bar keeps its last numbers (tests read them). The name is shown as plain text, its control
characters visible (chat_app.labels).
"""

from __future__ import annotations

from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from chat_app.labels import plain

KERNELS_BUILDING = "Building the CPU kernels (first launch only, about 20 s)"
KERNEL_STEPS = {"kernels cached": "CPU kernels: cached", "kernels built": "CPU kernels: built in {seconds:.0f} s",
                "kernels failed": "CPU kernels: the build failed; PyTorch's slower kernels instead (session.log)"}


class LoadProgress(Horizontal):
    DEFAULT_CSS = """
    LoadProgress {
        height: 1;
        padding: 0 1;
        display: none;
    }
    LoadProgress > Label {  /* not the bar's own percentage, whose width stays 5 */
        width: auto;
        max-width: 60%;
        margin-right: 2;
    }
    LoadProgress #step {
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    LoadProgress #detail {
        display: none;
        margin: 0 0 0 1;
    }
    LoadProgress.-building #detail {
        display: block;
    }
    LoadProgress.-building #step {  /* room for the files compiling at 80 columns */
        max-width: 45%;
    }
    LoadProgress.-building #percentage {
        display: none;
    }
    LoadProgress.-building ProgressBar, LoadProgress.-building Bar {
        width: 1fr;
    }
    """

    def __init__(self) -> None:
        super().__init__()
        self.name_shown = ""
        self.label = Label("", id="step")
        self.bar = ProgressBar(total=None, show_eta=False)
        self.detail = Label("", id="detail")

    def compose(self):
        yield self.label
        yield self.bar
        yield self.detail

    def start(self, name: str) -> None:
        self.name_shown = name
        self.remove_class("-building")
        self.label.update(plain(f"Opening {name}…"))
        self.bar.update(total=None, progress=0)
        self.display = True

    def advance(self, done: int, total: int) -> None:
        self.remove_class("-building")
        self.label.update(plain(f"Loading {self.name_shown}: {done:,}/{total:,} tensors"))
        self.bar.update(total=total, progress=done)

    def kernels(self, step: str, done: int, total: int, seconds: float, compiling: tuple[str, ...] = ()) -> None:
        """A step of the CPU kernels' build ("kernels", "kernels cached", "kernels built",
        "kernels failed")."""
        if step == "kernels":
            self.add_class("-building")
            self.label.update(KERNELS_BUILDING)
            now = compiling[0].removesuffix(".cpp") + (f" +{len(compiling) - 1}" if len(compiling) > 1 else "") \
                if compiling else ""
            self.detail.update(f"{done}/{total} files · {f'compiling {now} · ' if now else ''}{seconds:.0f} s")
            self.bar.update(total=None)
            return
        self.remove_class("-building")
        self.label.update(KERNEL_STEPS[step].format(seconds=seconds))

    def finish(self) -> None:
        self.remove_class("-building")
        self.display = False
