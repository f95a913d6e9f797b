"""StatusBar: one line under the input with what the decoder is doing.

Shows: model name, device and dtype, CUDA graphs (ON / OFF / "n/a on CPU") and which decode
step runs ("compiling…" while the compiled step is built in the background, then "compiled"),
decode tokens/s, time to first token, the attention bucket W, position / max_len ("cap" when
the context is less than the model's: --max-len lifts it), and last the
state (loading / ready / generating: last, so a narrow terminal clips it first). The app
calls `show(**fields)` at most once per drained batch; fields not known yet render as "-".
`line` holds the plain text (tests read it).
"""

from __future__ import annotations

from textual.widgets import Static

STEPS = {"plain": "", "compiling": " · compiling…", "compiled": " · compiled", "compile failed": " · plain step"}


class StatusBar(Static):
    def __init__(self, **kwargs) -> None:
        super().__init__("", markup=False, **kwargs)
        self.fields: dict[str, object] = {"state": "starting"}
        self.line = ""

    def show(self, **fields: object) -> None:
        self.fields.update(fields)
        self.line = self._format()
        self.update(self.line)

    def _format(self) -> str:
        f = self.fields
        if f["state"] in ("starting", "loading", "failed"):
            return f"{f['state']} {f.get('name', '')}".rstrip()
        graphs = {True: "ON", False: "OFF", None: "n/a on CPU"}[f.get("graphs")]
        step = STEPS.get(str(f.get("step", "plain")), "")
        tok_s = f.get("tok_s")
        ttft = f.get("ttft_ms")
        parts = [
            str(f.get("name", "")),
            f"{f.get('device', '-')} {f.get('dtype', '-')}",
            f"graphs {graphs}{step}",
            f"{tok_s:.0f} tok/s" if tok_s is not None else "- tok/s",
            f"TTFT {ttft:.0f} ms" if ttft is not None else "TTFT -",
            f"W {f.get('window') or '-'}",
            f"pos {f.get('position', '-')}/{f.get('max_len', '-')}{' cap' if f.get('capped') else ''}",
            str(f["state"]),
        ]
        return " · ".join(parts)
