"""The app's log of failures it did not expect: their tracebacks, where the user can send them.

Contract: `log(error, data_dir=None) -> str` appends a time line and `error`'s traceback to
LOG_NAME in the data folder (`data_dir`, else chat_app.store.default_data_dir()) and says where,
as the one line on stderr names it: "traceback in PATH", or "no log written: WHY" when the log
itself cannot be written. It never raises. Imports no torch and no textual.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

LOG_NAME = "tinyllm-chat.log"


def log(error: BaseException, data_dir: Path | None = None) -> str:
    try:
        from chat_app.store import default_data_dir

        path = (data_dir or default_data_dir()) / LOG_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"---- {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            f.write("".join(traceback.format_exception(type(error), error, error.__traceback__)))
        return f"traceback in {path}"
    except Exception as e:  # the log itself cannot be written: say so, on the same line
        return f"no log written: {e}"
