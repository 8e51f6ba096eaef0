"""SQLite's file format, read low-level and bounds-checked, for `pages.scan`.

The database header (and the page size guessed where the header cannot say it), the write-ahead
log's committed frames (its checksums and commit frames), b-tree page headers, varints, records
and their serial types (the format: https://www.sqlite.org/fileformat2.html). Every read is
bounds-checked: where the bytes are not ones the format allows, a reader raises `Damaged` (or
returns None, 0 or b""), and never anything else.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import BinaryIO

_HEADER_MAGIC = b"SQLite format 3\x00"
HEADER_SIZE = 100
_WAL_MAGICS = {0x377F0682: "<", 0x377F0683: ">"}  # the byte order of the log's checksums
_WAL_VERSION = 3007000
_WAL_HEADER_SIZE, _WAL_FRAME_HEADER_SIZE = 32, 24
PAGE_SIZES = tuple(1 << bits for bits in range(9, 17))
TABLE_INTERIOR, TABLE_LEAF, INDEX_INTERIOR, INDEX_LEAF = 0x05, 0x0D, 0x02, 0x0A
_MASK32 = 0xFFFFFFFF
# Where page 1 cannot say the page size, each size is tried on the pages of the file's first bytes.
_BYTES_TO_GUESS_FROM = 4 * 1024 * 1024
_PAGES_TO_GUESS_FROM = 1024
_TEXT_ENCODINGS = {0: "utf-8", 1: "utf-8", 2: "utf-16-le", 3: "utf-16-be"}


class Damaged(Exception):
    """A structure in the file is not one the format allows."""


# ----- the log and the header ---------------------------------------------------------------------

@dataclass(frozen=True)
class Log:
    """The committed part of a write-ahead log: its page size, the offset of each page's newest
    committed frame (its page data), and the database's size in pages after the last commit."""

    page_size: int
    frames: dict[int, int]
    page_count: int


def read_log(wal: BinaryIO | None) -> Log | None:
    """The committed frames of the log (None: no log, or its header is not valid).

    Frames count up to the last commit frame before the first frame that is not valid (salts that
    are not the header's, or a cumulative checksum that does not match), as SQLite counts them.
    """
    if wal is None:
        return None
    header = read_at(wal, 0, _WAL_HEADER_SIZE)
    if len(header) < _WAL_HEADER_SIZE:
        return None
    magic, version, page_size = struct.unpack_from(">III", header)
    order = _WAL_MAGICS.get(magic)
    if order is None or version != _WAL_VERSION or page_size not in PAGE_SIZES:
        return None
    checksum = _log_checksum(header[:24], (0, 0), order)
    if checksum != struct.unpack_from(">II", header, 24):
        return None
    salts = header[16:24]
    committed: dict[int, int] = {}
    pending: dict[int, int] = {}
    page_count = 0
    offset = _WAL_HEADER_SIZE
    frame_size = _WAL_FRAME_HEADER_SIZE + page_size
    while True:
        frame = read_at(wal, offset, frame_size)
        if len(frame) < frame_size or frame[8:16] != salts:
            break
        number, commit = struct.unpack_from(">II", frame)
        if number == 0:
            break
        checksum = _log_checksum(frame[:8], checksum, order)
        checksum = _log_checksum(frame[_WAL_FRAME_HEADER_SIZE:], checksum, order)
        if checksum != struct.unpack_from(">II", frame, 16):
            break
        pending[number] = offset + _WAL_FRAME_HEADER_SIZE
        if commit:
            committed.update(pending)
            pending.clear()
            page_count = commit
        offset += frame_size
    return Log(page_size, committed, page_count)


def _log_checksum(data: bytes, seed: tuple[int, int], order: str) -> tuple[int, int]:
    """SQLite's cumulative checksum of the log over `data` (a multiple of 8 bytes), from `seed`."""
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    first, second = seed
    # Two pairs of words a step, masked once (the sum is the same modulo 2**32): the loop over
    # every frame of the log is most of a scan's time.
    stream = iter(words)
    for even, odd, next_even, next_odd in zip(stream, stream, stream, stream):
        first += even + second
        second += odd + first
        first = (first + next_even + second) & _MASK32
        second = (second + next_odd + first) & _MASK32
    if len(words) % 4:
        first = (first + words[-2] + second) & _MASK32
        second = (second + words[-1] + first) & _MASK32
    return first, second


@dataclass(frozen=True)
class Header:
    """The fields of the 100-byte database header that reading rows needs."""

    page_size: int
    reserved: int
    page_count: int  # 0: the header's count is not current (older SQLite wrote it)
    freelist_trunk: int
    freelist_pages: int
    encoding: str


def parse_header(data: bytes) -> Header | None:
    """The header, or None where it is not one the format allows (a damaged header)."""
    if len(data) < HEADER_SIZE or data[:16] != _HEADER_MAGIC:
        return None
    raw_size, write_version, read_version, reserved = struct.unpack_from(">HBBB", data, 16)
    page_size = 65536 if raw_size == 1 else raw_size
    if page_size not in PAGE_SIZES or write_version not in (1, 2) or read_version not in (1, 2):
        return None
    # The payload fractions are fixed by the format; the usable size is at least 480 bytes.
    if data[21:24] != b"\x40\x20\x20" or page_size - reserved < 480:
        return None
    change_counter, page_count, trunk, free_pages = struct.unpack_from(">IIII", data, 24)
    encoding = _TEXT_ENCODINGS.get(struct.unpack_from(">I", data, 56)[0])
    if encoding is None:
        return None
    valid_for = struct.unpack_from(">I", data, 92)[0]
    return Header(page_size, reserved, page_count if valid_for == change_counter else 0, trunk,
                   free_pages, encoding)


def read_at(file: BinaryIO, offset: int, size: int) -> bytes:
    try:
        file.seek(offset)
        return file.read(size)
    except (OSError, ValueError, OverflowError):
        return b""


def file_size(file: BinaryIO) -> int:
    try:
        return file.seek(0, 2)
    except (OSError, ValueError):
        return 0


# ----- b-tree pages, cells and records --------------------------------------------------------------

def u16(data: bytes, offset: int) -> int:
    if offset + 2 > len(data):
        raise Damaged
    return (data[offset] << 8) | data[offset + 1]


def u32(data: bytes, offset: int) -> int:
    if offset + 4 > len(data):
        raise Damaged
    return int.from_bytes(data[offset:offset + 4], "big")


def varint(data: bytes, offset: int, limit: int) -> tuple[int, int]:
    """(value, offset after it) of the varint at `offset`, read no further than `limit`."""
    limit = min(limit, len(data))
    value = 0
    for index in range(9):
        if offset + index >= limit:
            raise Damaged
        byte = data[offset + index]
        if index == 8:
            return (value << 8) | byte, offset + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, offset + index + 1
    raise Damaged  # not reached: the ninth byte returns


def btree_page(data: bytes, number: int, usable: int) -> tuple[int, list[int], int]:
    """(page type, offsets of its cells, right-most child or 0) of a b-tree page; Damaged where
    its header or cell pointer array is not one the format allows."""
    start = HEADER_SIZE if number == 1 else 0
    if len(data) < usable or start + 8 > usable:
        raise Damaged
    kind = data[start]
    if kind not in (TABLE_INTERIOR, TABLE_LEAF, INDEX_INTERIOR, INDEX_LEAF):
        raise Damaged
    interior = kind in (TABLE_INTERIOR, INDEX_INTERIOR)
    header_end = start + (12 if interior else 8)
    count = u16(data, start + 3)
    content = u16(data, start + 5) or 65536
    array_end = header_end + 2 * count
    if not array_end <= content <= usable or data[start + 7] > 60:
        raise Damaged
    cells = [u16(data, offset) for offset in range(header_end, array_end, 2)]
    if any(not content <= cell < usable for cell in cells):
        raise Damaged
    return kind, cells, u32(data, start + 8) if interior else 0


def local_size(payload: int, usable: int, table: bool) -> int:
    """Bytes of a payload kept on its own page; the rest is on overflow pages (the format's rule)."""
    most = usable - 35 if table else (usable - 12) * 64 // 255 - 23
    if payload <= most:
        return payload
    least = (usable - 12) * 32 // 255 - 23
    local = least + (payload - least) % (usable - 4)
    return local if local <= most else least


# Bytes of the value of each serial type below 12 (10 and 11 are reserved: None).
_SERIAL_SIZES = (0, 1, 2, 3, 4, 6, 8, 8, 0, 0, None, None)


def record(payload: bytes, encoding: str) -> tuple:
    """The column values of a record; Damaged unless the record fills `payload` exactly."""
    end = len(payload)
    header_size, offset = varint(payload, 0, end)
    if header_size < offset or header_size > end:
        raise Damaged
    values: list[object] = []
    body = header_size
    while offset < header_size:
        serial = payload[offset]
        if serial < 0x80:  # most serial types are one byte: read them without a call
            offset += 1
        else:
            serial, offset = varint(payload, offset, header_size)
        if serial >= 12:
            size = (serial - 12) >> 1
            if body + size > end:
                raise Damaged
            if serial & 1:
                try:
                    values.append(payload[body:body + size].decode(encoding))
                except UnicodeDecodeError:
                    raise Damaged from None
            else:
                values.append(payload[body:body + size])
        else:
            size = _SERIAL_SIZES[serial]
            if size is None or body + size > end:
                raise Damaged
            values.append(_number(serial, payload[body:body + size]))
        body += size
    if body != end:
        raise Damaged
    return tuple(values)


def _number(serial: int, data: bytes) -> int | float | None:
    """The value of a serial type below 12 (NULL, an integer or a float)."""
    if serial == 0:
        return None
    if serial <= 6:
        return int.from_bytes(data, "big", signed=True)
    if serial == 7:
        value = struct.unpack(">d", data)[0]
        if math.isnan(value):  # SQLite stores NaN as NULL: a NaN here is damage
            raise Damaged
        return value
    return serial - 8  # the constants 0 and 1


# ----- the page size where the header cannot say it ------------------------------------------------

def guess_page_size(database: BinaryIO) -> int:
    """The page size whose pages most often read as b-tree pages (0: none do)."""
    sample = read_at(database, 0, _BYTES_TO_GUESS_FROM)
    best, best_count = 0, 0
    for size in PAGE_SIZES:
        count = 0
        for number in range(1, min(len(sample) // size, _PAGES_TO_GUESS_FROM) + 1):
            try:
                btree_page(sample[(number - 1) * size:number * size], number, size)
                count += 1
            except Damaged:
                pass
        if count > best_count:
            best, best_count = size, count
    return best
