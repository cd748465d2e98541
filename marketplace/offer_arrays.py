"""Operations on the offer index's arrays (``marketplace.offer_index``) that know nothing of
offers: a binary search in a field's order, a walk along it, a column compared with a value
or a set of word codes.

Why a module of its own: the index's own module holds how it stays current and how a search
is answered; these are the array steps that answer is made of, each testable alone.
"""

from __future__ import annotations

import numpy as np


def first_place(key: np.ndarray, perm: np.ndarray, value, *, after: bool) -> int:
    """The first place in ``perm`` (rows in ``key``'s ascending order) whose key is at least
    ``value`` (above it, with ``after``): a binary search that reads only the keys it needs."""
    low, high = 0, len(perm)
    while low < high:
        middle = (low + high) // 2
        found = key[perm[middle]]
        if found < value or (after and found == value):
            low = middle + 1
        else:
            high = middle
    return low


def any_of(column: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Which of the word codes in ``column`` are among ``codes``."""
    if len(codes) <= 4:
        found = np.zeros(len(column), dtype=bool)
        for code in codes.tolist():
            found |= column == code
        return found
    table = np.zeros(int(column.max(initial=0)) + 1, dtype=bool)
    table[codes[codes < len(table)]] = True
    return table[column]


def walk(
    order: np.ndarray, mask: np.ndarray, k: int, expected: int, *, limit: int
) -> np.ndarray | None:
    """The matching rows met first in ``order``, at least ``k`` of them where there are;
    None when they are not all found within ``limit`` places."""
    found, got, start, step = [], 0, 0, max(8192, expected + expected // 4)
    while start < len(order) and got < k:
        if start >= limit:
            return None
        rows = order[start : start + step]
        hit = rows[mask[rows]]
        found.append(hit)
        got += len(hit)
        start += step
        step *= 2
    return np.concatenate(found).astype(np.int64) if found else np.empty(0, dtype=np.int64)


def compare(column: np.ndarray, op: str, value) -> np.ndarray:
    if op == "<":
        return column < value
    if op == "<=":
        return column <= value
    if op == ">":
        return column > value
    return column >= value
