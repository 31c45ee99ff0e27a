"""A run's attempts as columns: what a report of 10^5 attempts reads without making an
object per attempt.

An :class:`AttemptTable` holds one column per field (a list or tuple, in store order), and
is also a sequence of records: ``table[i]`` is the i-th attempt (the record it was made
from, or a read-only lean record made on demand from the columns), so code that walks
records works unchanged and code that counts reads whole columns (``table.col("verdict")``)
in C-level passes.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Callable, Iterator, Sequence, overload


class AttemptTable(Sequence[Any]):
    """Columns of attempts (field -> values, all of one length), in store order.

    Made two ways: :meth:`of` from records (columns taken from them when first read; the
    records are what indexing gives back), or by a store's lean read from columns it
    fetched (``make`` turns one row's values, in ``fields`` order, into a lean record).
    Reading a field that was not read is an AttributeError naming it, never a default."""

    __slots__ = ("_cols", "_fields", "_n", "_records", "_make", "_lean")

    def __init__(self, columns: dict[str, Sequence[Any]], make: Callable[[Any], Any] | None = None,
                 records: Sequence[Any] | None = None, n: int | None = None) -> None:
        self._cols = columns
        self._fields = tuple(columns)
        lengths = {len(c) for c in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        self._n = n if n is not None else (lengths.pop() if lengths else len(records or ()))
        self._records = list(records) if records is not None else None
        self._make = make
        self._lean = records is None  # its columns are all it has

    @classmethod
    def of(cls, attempts: Any) -> "AttemptTable":
        """``attempts`` as a table: itself when it is one, else a table over the records
        (each column taken from them with one C-level map when first read)."""
        if isinstance(attempts, AttemptTable):
            return attempts
        records = list(attempts)
        return cls({}, records=records, n=len(records))

    def col(self, name: str) -> Sequence[Any]:
        """The column ``name``: one value per attempt, in order (read it, never change it)."""
        c = self._cols.get(name)
        if c is None:
            if self._lean:
                raise AttributeError(f"attempt record field {name!r}: not read by this lean read (add it to the fields read)")
            c = self._cols[name] = list(map(attrgetter(name), self._records))
        return c

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if self._records is not None:
            return self._records[i]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("attempt table index out of range")
        assert self._make is not None
        return self._make([self._cols[f][i] for f in self._fields])

    def __iter__(self) -> Iterator[Any]:
        if self._records is None:  # every record at once: one zip over the columns (C-level)
            assert self._make is not None
            self._records = list(map(self._make, zip(*(self._cols[f] for f in self._fields))))
        return iter(self._records)

    def rows(self, indexes: Sequence[int]) -> list[Any]:
        """The records at ``indexes``."""
        return [self[i] for i in indexes]
