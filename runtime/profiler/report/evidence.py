"""A rule's evidence (its report's ``Details``) as small tables a person reads, not JSON.

Each nested object becomes one table captioned with the keys that lead to it
(``algo-1 › Step:ModeKeys.TRAIN``): a handful of numbers side by side (a row of statistics),
anything else as name/value pairs. Lists of plain values are one cell, shortened past
``MAX_LIST``; a list of like objects is one table, a row each; numbers keep four significant
digits. What a plot draws (histogram bins,
workloads) is left to the plots.
"""

from __future__ import annotations

import re

import attrs

PLOT_ONLY = frozenset({"probs", "binedges", "workloads", "bottleneck_times"})
MAX_LIST = 12  # values of one list shown before "... N more"
MAX_TABLES = 16  # tables one rule's evidence may take on the page
WIDE_ROW = 8  # at most this many numbers are laid side by side


@attrs.frozen
class Table:
    caption: str
    header: tuple[str, ...]  # empty: name/value rows
    rows: tuple[tuple[str, ...], ...]


def label(key) -> str:
    """``number_of_outliers`` -> ``number of outliers``; other names as they are."""
    text = str(key)
    return text.replace("_", " ") if re.fullmatch(r"[a-z0-9_]+", text) else text


def cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        shown = ", ".join(cell(v) for v in value[:MAX_LIST])
        return shown + (f", ... {len(value) - MAX_LIST} more" if len(value) > MAX_LIST else "")
    return str(value)


def _plain(value) -> bool:
    if isinstance(value, (list, tuple)):
        return not any(isinstance(v, (dict, list, tuple)) for v in value)
    return not isinstance(value, dict)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _records(value) -> bool:
    """A list of objects with the same few plain fields: one table, a row each."""
    keys = [tuple(v) if isinstance(v, dict) else None for v in value]
    return (bool(value) and keys[0] is not None and len(keys[0]) <= WIDE_ROW
            and all(k == keys[0] for k in keys) and all(_plain(x) for v in value for x in v.values()))


def _walk(value, path: tuple[str, ...], out: list[Table]) -> None:
    if isinstance(value, (list, tuple)) and not _plain(value):
        if _records(value):
            rows = [tuple(cell(v) for v in item.values()) for item in value[:MAX_LIST]]
            if len(value) > MAX_LIST:
                rows.append((f"... {len(value) - MAX_LIST} more",) + ("",) * (len(rows[0]) - 1))
            out.append(Table(" › ".join(path), tuple(label(k) for k in value[0]), tuple(rows)))
            return
        for i, item in enumerate(value):
            _walk(item, path + (f"#{i + 1}",), out)
        return
    if not isinstance(value, dict):
        out.append(Table(" › ".join(path), (), (("value", cell(value)),)))
        return
    plain = {k: v for k, v in value.items() if k not in PLOT_ONLY and _plain(v)}
    if plain:
        caption = " › ".join(path)
        if len(plain) <= WIDE_ROW and all(_number(v) for v in plain.values()):
            out.append(Table(caption, tuple(label(k) for k in plain),
                             (tuple(cell(v) for v in plain.values()),)))
        else:
            out.append(Table(caption, (), tuple((label(k), cell(v)) for k, v in plain.items())))
    for key, nested in value.items():
        if key not in PLOT_ONLY and not _plain(nested):
            _walk(nested, path + (label(key),), out)


def tables(details: dict) -> tuple[list[Table], int]:
    """The evidence's tables (at most ``MAX_TABLES``) and how many more were left out."""
    out: list[Table] = []
    _walk({k: v for k, v in details.items() if k != "InsufficientData"}, (), out)
    return out[:MAX_TABLES], max(0, len(out) - MAX_TABLES)
