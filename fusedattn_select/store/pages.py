"""The rows of a SQLite database file, read page by page as SQLite's own `.recover` reads them.

SQLite reads a table through its b-tree, so one damaged root or interior page, or a damaged page 1,
hides every row below it although the leaf pages that hold the rows are intact. `scan` reads the
file itself, with the committed frames of its write-ahead log laid over it, and parses every table
leaf page (the file format: https://www.sqlite.org/fileformat2.html):

- a leaf page that a table's b-tree reaches (from its root page in sqlite_master) is that table's;
- any other leaf page is read only where nothing says it is stale, for the table its rows' shape
  names (the caller's `shape`): where that table's b-tree could not be read down to its leaves (a
  tree whose interior pages all read reaches every live leaf: a leaf outside it is a freed page),
  or, where sqlite_master cannot be read, where an interior page points to the leaf or its table
  has no interior page (the leaf is the table's root);
- pages on the freelist are never read for rows, and only the cells of a page's cell pointer array
  are: a deleted cell's bytes stay in a free block of its page, and never come back;
- a row of a leaf page outside its table's b-tree is read only if every index of the table that
  reads in full holds it. A freed page comes back only where its freelist entry, its table's
  interior pages and every index of its table are all damaged (or sqlite_master is).

Every read is bounds-checked: a damaged page loses its own rows and nothing else, and never raises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from fusedattn_select.store.sqlite_format import (
    HEADER_SIZE, INDEX_INTERIOR, INDEX_LEAF, TABLE_INTERIOR, TABLE_LEAF, Damaged, Header, btree_page,
    file_size, guess_page_size, local_size, parse_header, read_at, read_log, record, u32, varint,
)


@dataclass(frozen=True)
class Row:
    """One row as stored: its table, rowid and column values, its leaf page and overflow pages."""

    table: str
    rowid: int
    values: tuple
    page: int
    overflow: tuple[int, ...] = ()


@dataclass(frozen=True)
class PageScan:
    """What a scan read: the rows, and what it learned of the file on the way.

    `page_size` is 0 when no page size could be found (nothing was read). `schema` is the root page
    of each table; `complete` names the tables whose b-tree was read down to its leaves;
    `indexed_rows` the rows of each table by an index of it that reads in full (the rows there
    were, whether or not their pages still read); `wal_pages` the pages whose newest committed
    version is in the write-ahead log.
    """

    page_size: int
    page_count: int
    rows: tuple[Row, ...]
    schema: dict[str, int]
    complete: frozenset[str]
    indexed_rows: dict[str, int]
    header_damaged: bool
    freelist_complete: bool
    wal_pages: frozenset[int]


def scan(path: Path, shape: Callable[[tuple], str | None] = lambda values: None) -> PageScan:
    """Every row of `path` (with `<path>-wal`) that its pages still hold; see the module docstring.

    `shape(values)` names the table a row of these column values belongs to (None: none), for
    leaf pages that no b-tree reaches.
    """
    try:
        database = open(path, "rb")  # noqa: SIM115 (closed below, with the log)
    except OSError:
        return _NOTHING
    try:
        try:
            wal = open(f"{path}-wal", "rb")  # noqa: SIM115
        except OSError:
            wal = None
        try:
            return _Scanner(database, wal, shape).scan()
        finally:
            if wal is not None:
                wal.close()
    finally:
        database.close()


_NOTHING = PageScan(0, 0, (), {}, frozenset(), {}, True, False, frozenset())


# ----- the scan -----------------------------------------------------------------------------------------

class _Scanner:
    """One scan of a database file and its log (see the module docstring)."""

    def __init__(self, database: BinaryIO, wal: BinaryIO | None, shape: Callable[[tuple], str | None]) -> None:
        self.database, self.wal, self.shape = database, wal, shape
        self.file_size = file_size(database)
        self.log = read_log(wal)
        self.frames = self.log.frames if self.log else {}
        self.page_size = self.usable = self.page_count = self.last_page = 0
        self.encoding = "utf-8"
        self.indexes: dict[str, list[int]] = {}  # table -> root pages of its indexes
        self.witnesses: dict[str, list[dict[int, list[tuple]]]] = {}

    def scan(self) -> PageScan:
        header = parse_header(self._first_bytes())
        if header is not None and self.log is not None and header.page_size != self.log.page_size:
            header = None  # a log is only ever written with the database's page size
        self.page_size = (self.log.page_size if self.log else header.page_size if header
                          else guess_page_size(self.database))
        if not self.page_size:
            return _NOTHING
        self.usable = self.page_size - (header.reserved if header else 0)
        self.encoding = header.encoding if header else "utf-8"
        held = max([self.file_size // self.page_size, *self.frames])  # pages the files hold at all
        self.page_count = ((self.log.page_count if self.log else 0) or (header.page_count if header else 0)
                           or held)
        self.last_page = min(self.page_count, held)
        free, freelist_complete = self._freelist(header)

        schema, self.indexes, schema_pages, schema_whole = self._schema()
        owner: dict[int, str] = {}  # leaf page -> the table whose b-tree reaches it
        in_trees = set(schema_pages)
        complete = set()
        for table, root in schema.items():
            leaves, pages, whole = self._walk(root)
            in_trees |= pages
            complete |= {table} if whole else set()
            for leaf in leaves:
                owner.setdefault(leaf, table)

        rows = [row for leaf, table in owner.items() for row in self._leaf_rows(leaf, lambda values, t=table: t)]
        # Every live leaf page of a file whose sqlite_master and table b-trees all read in full was
        # reached above: a leaf outside them all is stale, and need not even be read.
        if not (schema_whole and complete == set(schema)):
            rows += self._orphan_rows(in_trees | free, schema, schema_whole, complete)
        counted = {}
        for table, roots in self.indexes.items():
            for pages in map(self._index_pages, roots):
                if pages is not None:
                    counted[table] = sum(len(cells) for _, cells, _ in pages)
                    break
        return PageScan(self.page_size, self.page_count, tuple(rows), schema, frozenset(complete), counted,
                        header is None, freelist_complete, frozenset(self.frames))

    # ----- pages

    def _first_bytes(self) -> bytes:
        if 1 in self.frames:
            return read_at(self.wal, self.frames[1], HEADER_SIZE)
        return read_at(self.database, 0, HEADER_SIZE)

    def _page(self, number: int) -> bytes | None:
        """Page `number` of the database as committed last (None: beyond it, or missing)."""
        if not 1 <= number <= self.page_count:
            return None
        if number in self.frames:
            data = read_at(self.wal, self.frames[number], self.page_size)
        else:
            data = read_at(self.database, (number - 1) * self.page_size, self.page_size)
        return data if len(data) == self.page_size else None

    # ----- structures

    def _freelist(self, header: Header | None) -> tuple[set[int], bool]:
        """The pages on the freelist, and whether all of them were found (the walk stops at the
        first trunk page that is not one)."""
        free: set[int] = set()
        if header is None:
            return free, False
        trunk = header.freelist_trunk
        per_trunk = self.usable // 4 - 2
        while trunk:
            data = self._page(trunk)
            if trunk < 2 or trunk in free or data is None:
                return free, False
            count = u32(data, 4)
            if count > per_trunk:
                return free, False
            leaves = [u32(data, 8 + 4 * index) for index in range(count)]
            if any(not 2 <= leaf <= self.page_count for leaf in leaves):
                return free, False
            free.add(trunk)
            free.update(leaves)
            trunk = u32(data, 0)
        return free, len(free) == header.freelist_pages

    def _walk(self, root: int) -> tuple[list[int], set[int], bool]:
        """The leaf pages of the table b-tree at `root`, every page of it that was read, and whether
        every interior page was read (so every leaf of it was reached or is itself damaged).

        All leaves of a b-tree are at one depth: a pointer at that depth that leads nowhere lost a
        leaf (its rows are gone), one above it lost an interior page (its leaves may be intact).
        """
        leaves: list[int] = []
        seen: set[int] = set()
        leaf_depths: set[int] = set()
        broken_depths: list[int] = []
        for number, depth, page in self._tree(root, TABLE_INTERIOR, TABLE_LEAF):
            seen.add(number)
            if page is None:
                broken_depths.append(depth)
            elif page[1] == TABLE_LEAF:
                leaves.append(number)
                leaf_depths.add(depth)
        whole = len(leaf_depths) <= 1 and all(depth >= max(leaf_depths, default=math.inf)
                                              for depth in broken_depths)
        return leaves, seen, whole

    def _tree(self, root: int, interior: int, leaf: int) -> Iterator[tuple[int, int, tuple | None]]:
        """Each page of the b-tree at `root` (children in order, a page reached twice read once):
        (page number, depth, (data, kind, cell offsets), or None where it is not a page of that tree)."""
        seen: set[int] = set()
        stack = [(root, 0)]
        while stack:
            number, depth = stack.pop()
            data = None if number in seen else self._page(number)
            seen.add(number)
            try:
                if data is None:
                    raise Damaged
                kind, cells, right = btree_page(data, number, self.usable)
                if kind not in (interior, leaf):
                    raise Damaged
                if kind == interior:
                    children = [u32(data, cell) for cell in cells] + [right]
                    stack.extend((child, depth + 1) for child in reversed(children))
            except Damaged:
                yield number, depth, None
                continue
            yield number, depth, (data, kind, cells)

    def _schema(self) -> tuple[dict[str, int], dict[str, list[int]], set[int], bool]:
        """The root page of each table and the root pages of each table's indexes of every row, as
        sqlite_master holds them; the pages of sqlite_master, and whether all of it was read."""
        tables: dict[str, int] = {}
        indexes: dict[str, list[int]] = {}
        leaves, pages, whole = self._walk(1)
        for leaf in leaves:
            for row in self._leaf_rows(leaf, lambda values: "sqlite_master"):
                kind, name, table, root, sql = (row.values + (None,) * 5)[:5]
                if not (isinstance(name, str) and isinstance(table, str) and isinstance(root, int) and root > 1):
                    continue
                if kind == "table":
                    tables.setdefault(name, root)
                elif kind == "index" and not (isinstance(sql, str) and " where " in " ".join(sql.lower().split())):
                    indexes.setdefault(table, []).append(root)  # a partial index does not list every row
        return tables, indexes, pages, whole

    def _index_pages(self, root: int) -> list[tuple[bytes, list[int], bool]] | None:
        """(page, offsets of its cells, whether it is an interior page) of every page of the index
        b-tree at `root` (None: not every page of it reads)."""
        pages = []
        for _, _, page in self._tree(root, INDEX_INTERIOR, INDEX_LEAF):
            if page is None:
                return None
            data, kind, cells = page
            pages.append((data, cells, kind == INDEX_INTERIOR))
        return pages

    def _index_entries(self, root: int) -> dict[int, list[tuple]] | None:
        """The entries of the index b-tree at `root` by the rowid they point to: the indexed values
        (None: not every page or entry of it reads)."""
        pages = self._index_pages(root)
        if pages is None:
            return None
        entries: dict[int, list[tuple]] = {}
        try:
            for data, cells, interior in pages:
                for cell in cells:  # an interior cell of an index holds an entry too
                    offset = cell + 4 if interior else cell
                    size, offset = varint(data, offset, self.usable)
                    values = record(self._payload(data, offset, size, table=False)[0], self.encoding)
                    if not values or type(values[-1]) is not int:
                        raise Damaged
                    entries.setdefault(values[-1], []).append(values[:-1])
        except Damaged:
            return None
        return entries

    def _witnesses(self, table: str) -> list[dict[int, list[tuple]]]:
        """The entries of each index of `table` that reads in full (see `_indexed`)."""
        if table not in self.witnesses:
            entries = (self._index_entries(root) for root in self.indexes.get(table, ()))
            self.witnesses[table] = [by_rowid for by_rowid in entries if by_rowid is not None]
        return self.witnesses[table]

    def _indexed(self, row: Row) -> bool:
        """Whether every index of the row's table that reads in full holds an entry for it: an
        index that reads is the table's list of live rows, so a row it does not hold was deleted
        (its page freed, the freelist entry of the page lost)."""
        return all(any(all(value in row.values for value in entry) for entry in by_rowid.get(row.rowid, ()))
                   for by_rowid in self._witnesses(row.table))

    # ----- rows

    def _leaf_rows(self, number: int, table_of: Callable[[tuple], str | None]) -> list[Row]:
        """The rows of the cells of leaf page `number` that parse whole, each with the table
        `table_of(values)` names (a row it names none of is dropped)."""
        data = self._page(number)
        if data is None:
            return []
        try:
            kind, cells, _ = btree_page(data, number, self.usable)
        except Damaged:
            return []
        if kind != TABLE_LEAF:
            return []
        rows = []
        for cell in cells:
            try:
                rowid, values, overflow = self._cell(data, cell)
            except Damaged:
                continue
            table = table_of(values)
            if table is not None:
                rows.append(Row(table, rowid, values, number, overflow))
        return rows

    def _cell(self, data: bytes, offset: int) -> tuple[int, tuple, tuple[int, ...]]:
        """(rowid, values, overflow pages) of the table leaf cell at `offset`."""
        size, offset = varint(data, offset, self.usable)
        rowid, offset = varint(data, offset, self.usable)
        payload, overflow = self._payload(data, offset, size, table=True)
        return rowid - (1 << 64) if rowid >= 1 << 63 else rowid, record(payload, self.encoding), overflow

    def _payload(self, data: bytes, offset: int, size: int, table: bool) -> tuple[bytes, tuple[int, ...]]:
        """The `size` bytes of payload of the cell whose payload starts at `offset` (of a table
        b-tree or an index b-tree), and the overflow pages that hold what its page does not."""
        usable = self.usable
        if size > self.last_page * usable:  # more bytes than the files hold
            raise Damaged
        local = local_size(size, usable, table)
        if offset + local > usable:
            raise Damaged
        parts = [data[offset:offset + local]]
        overflow: list[int] = []
        if local < size:
            if offset + local + 4 > usable:
                raise Damaged
            number, remaining = u32(data, offset + local), size - local
            while remaining:
                page = None if number in overflow else self._page(number)
                if page is None or number == 1:
                    raise Damaged
                taken = min(remaining, usable - 4)
                parts.append(page[4:4 + taken])
                overflow.append(number)
                remaining -= taken
                number = u32(page, 0)
            if number != 0:  # the last overflow page points nowhere
                raise Damaged
        return b"".join(parts), tuple(overflow)

    def _orphan_rows(self, excluded: set[int], schema: dict[str, int], schema_whole: bool,
                     complete: set[str]) -> list[Row]:
        """The rows of leaf pages that no b-tree reached, where nothing says they are stale."""
        leaves: dict[int, list[Row]] = {}
        children: set[int] = set()  # pages that an interior page outside every tree points to
        for number in range(2, self.last_page + 1):
            if number in excluded:
                continue
            data = self._page(number)
            if data is None or data[0] not in (TABLE_LEAF, TABLE_INTERIOR):
                continue
            if data[0] == TABLE_LEAF:
                leaves[number] = self._leaf_rows(number, self.shape)
                continue
            try:
                _, cells, right = btree_page(data, number, self.usable)
                children.update([u32(data, cell) for cell in cells] + [right])
            except Damaged:
                continue
        # A table whose b-tree is unknown but has interior pages has no root leaf: a leaf of its
        # shape that no interior page points to was freed.
        in_interior_trees = {row.table for number, rows in leaves.items() if number in children for row in rows}
        kept = []
        for number, rows in leaves.items():
            for row in rows:
                if row.table in schema:
                    stale = row.table in complete or not self._indexed(row)
                elif schema_whole:
                    stale = True  # a table this database does not have
                else:
                    stale = number not in children and row.table in in_interior_trees
                if not stale:
                    kept.append(row)
        return kept
