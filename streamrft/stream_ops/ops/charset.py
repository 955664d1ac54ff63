"""Non-printable and wrong-script text: drop a trajectory with too many control characters or
too many letters outside the allowed scripts.

A letter's script is the first word of its Unicode name (LATIN, CYRILLIC, GREEK, ARABIC, CJK,
HIRAGANA, ...): a dependency-free heuristic that tells scripts, not languages (English from French
needs a language-ID model). Params: `max_nonprintable` (0.0, fraction of characters that are not
printable, newline and tab allowed), `scripts` (None: any; e.g. ["LATIN"]), `max_foreign` (0.1).
"""
from __future__ import annotations

import unicodedata

ALLOWED_CONTROLS = "\n\t\r"


def nonprintable_fraction(text: str) -> float:
    if not text:
        return 0.0
    return sum(1 for c in text if not c.isprintable() and c not in ALLOWED_CONTROLS) / len(text)


def foreign_fraction(text: str, scripts: set[str]) -> float:
    """Of the letters, the fraction whose script is not in `scripts`."""
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return 0.0
    return sum(1 for c in letters if unicodedata.name(c, "UNKNOWN").split()[0] not in scripts) / len(letters)


def make(max_nonprintable: float = 0.0, scripts: list[str] | None = None, max_foreign: float = 0.1):
    for name, v in (("max_nonprintable", max_nonprintable), ("max_foreign", max_foreign)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name}={v!r} must be in [0, 1]")
    allowed = {s.upper() for s in scripts} if scripts else None

    def charset_op(group) -> dict[int, str]:
        drops = {}
        for i, t in enumerate(group.trajectories):
            bad = nonprintable_fraction(t.response_text)
            if bad > max_nonprintable:
                drops[i] = f"non-printable fraction {bad:.3f} > {max_nonprintable}"
                continue
            if allowed is not None:
                foreign = foreign_fraction(t.response_text, allowed)
                if foreign > max_foreign:
                    drops[i] = f"letters outside {sorted(allowed)}: {foreign:.3f} > {max_foreign}"
        return drops

    return charset_op
