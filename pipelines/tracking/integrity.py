"""Refuse a damaged SQLite store before MLflow or Optuna opens it.

MLflow treats a 0-byte ``mlflow.db`` as a new store (it creates empty tables in it, and
every run it held is gone from view while their checkpoints and artifacts stay beside
it), and a truncated one fails deep inside SQLAlchemy with a 275-line traceback; Optuna
does the same with ``optuna.db``. :func:`check_sqlite` reads the file's header (O(1):
the 100-byte SQLite header records the page size and the page count) and says in one
line what is wrong with which file and what to do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from pipelines.spec.files import SpecError

__all__ = ["StoreError", "cause_of", "check_sqlite", "store_errors"]

_MAGIC = b"SQLite format 3\x00"
E = TypeVar("E", bound=BaseException)


class StoreError(SpecError):
    """A store's database cannot be used as it is (refused, like bad input: exit 2)."""


def cause_of(err: BaseException, kind: type[E]) -> E | None:
    """The first exception of type ``kind`` in ``err``'s chain (itself, what it was raised
    from, what it was raised while handling), or None."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, kind):
        cause = cause.__cause__ or cause.__context__
    return cause


def _restore(db: Path) -> str:
    return f"restore it from a backup, or move {db.parent} away to start a new store"


def check_sqlite(db: Path, what: str, beside: tuple[str, ...] = ()) -> None:
    """Raise :class:`StoreError` if ``db`` (``what``: "the MLflow store") exists but is not a
    whole SQLite database. A 0-byte file is taken for a new store whose creation was cut
    off unless one of the folders named in ``beside`` holds files (then it was emptied)."""
    try:
        size = db.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        held = [name for name in beside if (db.parent / name).is_dir() and any((db.parent / name).iterdir())]
        if held:
            folders = " and ".join(f"{name}/" for name in held)
            raise StoreError(
                f"{db} ({what}) is empty (0 bytes), but {folders} beside it still hold its runs' files: {_restore(db)}"
            )
        return
    with open(db, "rb") as handle:
        header = handle.read(100)
    if len(header) < 100 or not header.startswith(_MAGIC):
        raise StoreError(f"{db} ({what}) is not a SQLite database (overwritten or damaged): {_restore(db)}")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The page count is valid when the header's "version-valid-for" equals its change
    # counter; a write-ahead log may hold pages not yet in the file.
    counted = header[24:28] == header[92:96] and not db.with_name(db.name + "-wal").exists()
    if counted and size < page_size * pages:
        raise StoreError(f"{db} ({what}) is truncated ({size:,} of its {page_size * pages:,} bytes): {_restore(db)}")


@contextlib.contextmanager
def store_errors(db: Path | None, what: str) -> Iterator[None]:
    """Inside, a database error of ``db`` (damage the header does not show) becomes a
    :class:`StoreError` naming the file."""
    import sqlite3

    try:
        yield
    except StoreError:
        raise
    except Exception as err:
        cause = cause_of(err, sqlite3.DatabaseError)
        if cause is None or db is None:
            raise
        raise StoreError(f"{db} ({what}) cannot be read ({type(cause).__name__}: {cause}): {_restore(db)}") from err
