"""Exact and near-duplicate responses, within a group and across the recent run: drop the later copy.

Per task (its prompt): an exact duplicate has the same normalised text (whitespace collapsed,
lower-cased); a near duplicate has a MinHash (datasketch, word `shingle`-grams) Jaccard estimate
over `threshold` with an earlier response, found through MinHashLSH. The memory across groups is
the last `window` responses per worker (oldest evicted first), so it is bounded; `across_run:
false` keeps it to one group. Responses under `min_words` words are never deduplicated: short
answers ("4") are meant to agree. A redelivered trajectory (same traj_id) is not its own duplicate.
"""
from __future__ import annotations

import hashlib
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # datasketch pulls in scipy (~0.6 s): imported when a dedup op is made
    from datasketch import MinHash


def normalise(text: str) -> str:
    return " ".join(text.split()).lower()


def minhash(text: str, shingle: int, num_perm: int) -> MinHash:
    from datasketch import MinHash

    words = normalise(text).split()
    m = MinHash(num_perm=num_perm)
    for i in range(max(len(words) - shingle + 1, 1)):
        m.update(" ".join(words[i:i + shingle]).encode())
    return m


def make(threshold: float = 0.8, shingle: int = 3, num_perm: int = 64, min_words: int = 8,
         window: int = 10000, across_run: bool = True, near: bool = True):
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold={threshold!r} must be in (0, 1]")
    if shingle < 1 or num_perm < 16 or window < 1 or min_words < 0:
        raise ValueError("shingle >= 1, num_perm >= 16, window >= 1 and min_words >= 0 are required")
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    exact: dict[str, str] = {}  # hash of (prompt, normalised text) -> traj_id of its first copy
    order: deque[tuple[str, str]] = deque()  # (exact key, lsh key), oldest first

    def remember(key: str, lsh_key: str, m: MinHash | None) -> None:
        if m is not None:
            lsh.insert(lsh_key, m)
        order.append((key, lsh_key if m is not None else ""))
        while len(order) > window:
            old_key, old_lsh = order.popleft()
            exact.pop(old_key, None)
            if old_lsh:
                lsh.remove(old_lsh)

    def dedup_op(group) -> dict[int, str]:
        prompt = hashlib.sha1(group.task.prompt.encode()).hexdigest()[:16]
        drops: dict[int, str] = {}
        added: list[tuple[str, str]] = []
        for i, t in enumerate(group.trajectories):
            text = normalise(t.response_text)
            if len(text.split()) < min_words:
                continue
            key = prompt + hashlib.sha1(text.encode()).hexdigest()
            first = exact.get(key)
            if first is not None and first != t.traj_id:
                drops[i] = f"exact duplicate of trajectory {first}"
                continue
            m = minhash(text, shingle, num_perm) if near else None
            if m is not None:
                similar = [k for k in lsh.query(m) if k.startswith(prompt) and k[len(prompt) + 1:] != t.traj_id]
                if similar:
                    drops[i] = f"near duplicate (MinHash Jaccard >= {threshold}) of trajectory {similar[0][len(prompt) + 1:]}"
                    continue
            if first is None:
                exact[key] = t.traj_id
                lsh_key = f"{prompt}:{t.traj_id}"
                remember(key, lsh_key, m if m is not None and lsh_key not in lsh else None)
                added.append((key, lsh_key))
        if not across_run:  # forget this group's responses: the memory spans one group only
            for key, lsh_key in added:
                exact.pop(key, None)
                if lsh_key in lsh:
                    lsh.remove(lsh_key)
            order.clear()
        return drops

    return dedup_op
