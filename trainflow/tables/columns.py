"""Checks of a table's column names, shared by the files' reading and the source formats' own header checks."""

from __future__ import annotations


def check_names(names: list[str], source: str, empty_ok: bool = True) -> None:
    """DataError when a column name appears more than once (pyarrow would fail later with a KeyError), or (empty_ok
    False: a table handed over in memory) is empty."""
    from trainflow.errors import DataError

    empty = [i for i, n in enumerate(names) if not str(n).strip()]
    if empty and not empty_ok:
        raise DataError(f"{source}: column(s) at position {empty} have an empty name; give every column a name")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DataError(f"{source}: column name(s) {repeated} appear more than once; give every column its own name")
