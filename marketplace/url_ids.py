"""``<id:…>`` in a URL: a row's id as the database can hold it (a bigint, 1 to 2**63 - 1).

A longer or larger number never matches, so the path answers 404 like any other missing row,
instead of reaching a query with a number the database cannot take. Registered when the app
is ready (marketplace/apps.py), before any URLconf is read.
"""

from __future__ import annotations

from django.urls import register_converter

MAX_ID = 2**63 - 1  # PostgreSQL's bigint, every primary key's type


class IdConverter:
    regex = "[0-9]{1,19}"

    def to_python(self, value: str) -> int:
        number = int(value)
        if not 1 <= number <= MAX_ID:
            raise ValueError("not a row id")  # the pattern does not match: a 404
        return number

    def to_url(self, value: int) -> str:
        return str(value)


def register() -> None:
    register_converter(IdConverter, "id")
