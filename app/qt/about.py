"""The About box: Parley's licence and the licences of the bundled model."""
from __future__ import annotations

import html

from PySide6.QtWidgets import QMessageBox, QWidget

from app.core.version import parley_version
from app.qt.models_dialog import size_text
from engine.loading.default_model import LICENSE_NOTE


def about_html(models=None) -> str:
    loaded = ""
    if models is not None:
        names = [_described(s) for s in models.states.values() if s.status == "loaded"]
        loaded = f"<p>Loaded now: {', '.join(names) or 'none'}</p>"
    return (
        f"<h3>Parley</h3><p>Version {html.escape(parley_version())}</p><p>A desktop chat app for local language models: every live chat is batched into one "
        "forward per step.</p><p>Parley's code: Apache-2.0.</p>"
        "<p><b>Bundled model.</b> " + LICENSE_NOTE + "</p>"
        "<p>Qt for Python (PySide6): LGPLv3 · markdown-it-py: MIT · Pygments: BSD-2-Clause · PyTorch: BSD-3-Clause</p>"
        + loaded
    )


def _described(state) -> str:
    """A loaded model's name with how its weights are held and their size, e.g. "gemma (Q4_K→int4 ×27 …, 248 MB)"."""
    info = state.info or {}
    size = size_text(info["weights_mb"] * 1e6) if info.get("weights_mb") else None
    parts = [p for p in (info.get("quantization"), size) if p]
    return html.escape(state.name + (f" ({', '.join(parts)})" if parts else ""))


def show_about(parent: QWidget, models=None) -> None:
    QMessageBox.about(parent, "About Parley", about_html(models))
