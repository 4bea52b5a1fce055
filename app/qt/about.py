"""The About box: Parley's licence and the licences of the bundled model, and the models loaded now."""
from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget

from app.core.version import parley_version
from app.qt.models_dialog import size_text
from engine.loading.default_model import LICENSE_NOTE


def about_html(models=None) -> str:
    loaded = ""
    if models is not None:
        rows = "".join(f"<li>{_described(s)}</li>" for s in _loaded(models))
        loaded = f"<p>Loaded now:</p><ul>{rows}</ul>" if rows else "<p>Loaded now: none</p>"
    return (
        f"<h3>Parley</h3><p>Version {html.escape(parley_version())}</p><p>A desktop chat app for local language models: every live chat is batched into one "
        "forward per step.</p><p>Parley's code: Apache-2.0.</p>"
        "<p><b>Bundled model.</b> " + LICENSE_NOTE + "</p>"
        "<p>Qt for Python (PySide6): LGPLv3 · markdown-it-py: MIT · Pygments: BSD-2-Clause · PyTorch: BSD-3-Clause</p>"
        + loaded
    )


def loaded_details(models) -> str:
    """Each loaded model's weights in full ("Q4_K→int4 ×27, Q6_K→int8 ×4, …"), for the box's details."""
    return "\n".join(f"{s.entry.name}: {(s.info or {}).get('quantization') or '?'}" for s in _loaded(models))


def quantization_summary(breakdown: str) -> str:
    """A weights breakdown in a word: "Q4_K→int4 ×27, Q6_K→int8 ×4" is "mostly Q4_K"; one kind or a float dtype as is."""
    kinds = [kind.split(" ×")[0].split("→")[0] for kind in breakdown.split(", ") if kind]
    if len(set(kinds)) > 1:
        return f"mostly {kinds[0]}"  # the breakdown lists the most frequent first
    return kinds[0] if kinds else ""


def _loaded(models) -> list:
    return [s for s in models.states.values() if s.status == "loaded"]


def _described(state) -> str:
    """A loaded model as the model list names it, its weights in a word and their size in memory, e.g.
    "gemma-3-270m (mostly Q4_K, 248 MB in memory)": the whole breakdown made a line of every kind of matrix."""
    info = state.info or {}
    size = size_text(info["weights_mb"] * 1e6) + " in memory" if info.get("weights_mb") else None
    parts = [p for p in (quantization_summary(info.get("quantization") or ""), size) if p]
    return html.escape(state.entry.name + (f" ({', '.join(parts)})" if parts else ""))


def show_about(parent: QWidget, models=None) -> QMessageBox:
    box = QMessageBox(QMessageBox.Icon.NoIcon, "About Parley", about_html(models), QMessageBox.StandardButton.Ok, parent)
    if not parent.windowIcon().isNull():  # as QMessageBox.about shows it
        box.setIconPixmap(parent.windowIcon().pixmap(64))
    if models is not None and (details := loaded_details(models)):
        box.setDetailedText(details)  # "Show Details…": how every kind of matrix is held
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.open()
    return box
