"""Three-way merge of settings.json: what Parley changed since it last read or wrote the file, applied to the file as
another program (an editor, a sync tool) may have changed it meanwhile."""
from __future__ import annotations

from typing import Any

GONE = object()  # a key the dict does not hold


def merged(before: Any, ours: Any, theirs: Any) -> Any:
    """`theirs` (the file now) with what changed from `before` to `ours` applied, dicts key by key; where both changed
    one value, ours (the user's latest act in the app). A key whose value comes out GONE is left out."""
    if ours == before:
        return theirs
    if not (isinstance(ours, dict) and isinstance(theirs, dict)):
        return ours
    out = {k: merged(_get(before, k), _get(ours, k), _get(theirs, k)) for k in {**theirs, **ours}}
    return {k: v for k, v in out.items() if v is not GONE}


def _get(d: Any, key: str) -> Any:
    return d.get(key, GONE) if isinstance(d, dict) else GONE
