"""StatusBar: one line under the input with what the decoder is doing.

Shows, in this order: decode tokens/s, the attention bucket W, position / max_len ("cap" when
the context is less than the model's: --max-len lifts it), the state (loading / ready /
prefilling / generating), the model name, time to first token, which decode step runs ("compiling…" while
the compiled step is built in the background, then "compiled"; "native" / "eager" on a CPU),
CUDA graphs (ON / OFF; left out on a CPU, where there are none), the device with the weights
as held ("cpu int4", "cuda bf16": a quantized model's matrices, not the activations' float32;
a server's host:port, its step "remote", its context "-": chat_app.server_session),
and where the chat template has a thinking switch, "think on" / "think off". The model family
("qwen3") follows the name. The live numbers come first: they are what a narrow terminal keeps, and notices
(shown above the bar) never cover them. When the line does not fit, the model name is
shortened ("Smollm2 135M 8k…") and the fields after it are left out, the least useful first:
CUDA graphs, then TTFT, then the family, then thinking; the device and weights and the decode
step go last (the step says whether the fast path runs: issue 46): the name is shortened (to 8
characters at least) to keep them, so at 80 and 100 columns they stay. Each
field is a Textual `reactive` (the model's name is `model_name`): setting one redraws the line;
`show(**fields)` sets several at once (at most once per batch of the session's events) and
redraws once. `fields` is their values by name ("name" for the model's). Fields not known
yet render as "-". `line` is the whole plain text, `shown` what fits. The model's name is
shown as plain text, its control characters visible (chat_app.labels).
"""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from chat_app.labels import plain

STEPS = {"plain": "", "compiling": "compiling…", "compiled": "compiled", "native": "native", "eager": "eager",
         "compile failed": "plain step", "remote": "remote"}
NAME_MIN = 8  # a long model name is cut to no less than this
NAME_NARROW = 20  # ... and to this below NARROW columns, so growing numbers do not push it around
NARROW = 100
FIELDS = ("state", "model_name", "tok_s", "ttft_ms", "window", "position", "max_len", "capped", "step", "graphs",
          "device", "weights", "family", "thinking")  # the reactive ones, in the order declared
KEEP = ("device", "step", "think", "family", "ttft", "graphs")  # the fields after the name, the most useful first


def shorten(name: str, width: int) -> str:
    return name if len(name) <= width else name[:max(width - 1, 1)].rstrip() + "…"


class StatusBar(Static):
    state: reactive[str] = reactive("starting")  # starting / loading / ready / prefilling / generating / ...
    model_name: reactive[str] = reactive("")
    tok_s: reactive[float | None] = reactive(None)
    ttft_ms: reactive[float | None] = reactive(None)
    window: reactive[int | None] = reactive(None)  # the attention bucket W
    position: reactive[int | str] = reactive("-")
    max_len: reactive[int | None] = reactive(None)
    capped: reactive[bool] = reactive(False)  # the context is less than the model's
    step: reactive[str] = reactive("plain")
    graphs: reactive[bool | None] = reactive(None)  # None: no graphs here
    device: reactive[str] = reactive("-")
    weights: reactive[str] = reactive("-")
    family: reactive[str] = reactive("")
    thinking: reactive[bool | None] = reactive(None)  # None: the template has no switch

    def __init__(self, **kwargs) -> None:
        super().__init__("", markup=False, **kwargs)

    @property
    def fields(self) -> dict[str, object]:
        return {("name" if key == "model_name" else key): getattr(self, key) for key in FIELDS}

    def show(self, **fields: object) -> None:
        for key, value in fields.items():
            self.set_reactive(getattr(StatusBar, "model_name" if key == "name" else key), value)
        self.refresh()

    @property
    def line(self) -> str:
        parts, name = self._parts()
        return " · ".join(p for p in parts[:4] + [name] + parts[4:] if p)

    @property
    def shown(self) -> str:
        parts, name = self._parts()
        return self._fit(parts, name, self.content_size.width or 10_000)

    def render(self) -> Text:
        return plain(self.shown)

    def _parts(self) -> tuple[list[str], str]:
        """(the fields, model name apart, as [live..., state, optional...]), and the name."""
        f = self.fields
        name = str(f["name"])
        if f["state"] in ("starting", "loading", "failed"):
            return [str(f["state"])], name
        tok_s = f.get("tok_s")
        live = [
            f"{tok_s:.0f} tok/s" if tok_s is not None else "- tok/s",
            f"W {f.get('window') or '-'}",
            f"pos {f.get('position', '-')}/{f.get('max_len') or '-'}{' cap' if f.get('capped') else ''}",
            str(f["state"]),
        ]
        return live + [p for p in self._optional().values() if p], name

    def _optional(self) -> dict[str, str]:
        """The fields after the name, in the order shown ("" for one not shown)."""
        f = self.fields
        ttft, graphs = f.get("ttft_ms"), f.get("graphs")
        return {"family": str(f.get("family") or ""),
                "ttft": f"TTFT {ttft:.0f} ms" if ttft is not None else "TTFT -",
                "step": STEPS.get(str(f.get("step", "plain")), ""),
                "graphs": "" if graphs is None else f"graphs {'ON' if graphs else 'OFF'}",
                "device": f"{f.get('device', '-')} {f.get('weights', '-')}".strip(),
                "think": "" if f.get("thinking") is None else f"think {'on' if f['thinking'] else 'off'}"}

    def _fit(self, parts: list[str], name: str, width: int) -> str:
        """The live fields, the state, the name (shortened) and as many others as fit, the
        least useful (KEEP's last) left out first."""
        if len(parts) == 1:  # starting / loading / failed: the state, then the name
            return shorten(f"{parts[0]} {name}", width)
        line = " · ".join(parts[:4])
        room = width - len(line) - 3
        if room < NAME_MIN:
            return shorten(line, width)
        optional = {k: p for k, p in self._optional().items() if p}
        cap = NAME_NARROW if width < NARROW else room
        for keys in (("device", "step"), ("device",)):  # the name gives way to the device and the step
            kept_for = sum(3 + len(optional[k]) for k in keys if k in optional)
            if room - kept_for >= NAME_MIN:
                cap = min(cap, room - kept_for)
                break
        line += " · " + shorten(name, max(NAME_MIN, min(len(name), room, cap)))
        kept: set[str] = set()
        used = len(line)
        for key in KEEP:
            if key in optional and used + 3 + len(optional[key]) <= width:
                kept.add(key)
                used += 3 + len(optional[key])
        return " · ".join([line] + [p for k, p in optional.items() if k in kept])
