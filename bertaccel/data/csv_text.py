"""A CSV file read the way people save one: what a spreadsheet, pandas or Excel writes.

- Encodings: UTF-8 (with or without the byte-order mark Excel's "CSV UTF-8" writes), UTF-16
  with its mark (Excel's "Unicode Text", tab-separated), else Windows-1252 (Excel's plain "CSV"
  on Windows; it covers Latin-1's printable characters). Anything else is refused in one line
  that says what the file is instead (gzip, a ZIP such as an .xlsx workbook, binary) and how to
  fix it.
- Line endings \\n, \\r\\n and \\r, and quoted fields holding commas, quotes or line breaks: the
  csv module's own reading (no hand parsing).
- The delimiter: ',' or, where the header reads only that way, ';' (Excel in locales with a
  decimal comma) or a tab. A header that reads with more than one, or names a needed column
  twice, is refused: it cannot be read one way only.

Records come with the line each starts on, so a bad cell is named by its line and column even
after a field that spans lines.
"""
from __future__ import annotations

import codecs
import csv
import gzip
import io
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

DELIMITERS = (",", ";", "\t")
_NAMES = {",": "','", ";": "';'", "\t": "a tab"}
GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"


class CsvTextError(ValueError):
    """The file cannot be read as one CSV; the message (without the file's name) says why and how to fix it."""


def decompressed(raw: bytes) -> bytes:
    """raw, or what it holds when it is gzip-compressed (whatever the file is called)."""
    if not raw.startswith(GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError) as e:
        raise CsvTextError(f"gzip-compressed but cannot be decompressed ({e}); gunzip -t it, or give the "
                           "uncompressed CSV") from None


def gunzip_hint(name: str) -> str:
    """The command that decompresses a gzip file named name beside it, and what to give then."""
    if name.endswith(".gz"):
        return f"gunzip -k {name}, then give {name[:-3]}"
    out = (name[:-4] if name.endswith(".csv") else name) + "-unzipped.csv"
    return f"gunzip -c {name} > {out}, then give {out}"


def decode(raw: bytes, name: str = "FILE") -> Tuple[str, str]:
    """(text, the encoding it was read as); CsvTextError says what the bytes are instead.
    name: the file, for the command the message suggests."""
    if raw.startswith(GZIP_MAGIC):
        raise CsvTextError(f"is gzip-compressed, not a CSV; decompress it first: {gunzip_hint(name)}")
    if raw.startswith(ZIP_MAGIC):
        raise CsvTextError("is a ZIP archive (an Excel .xlsx workbook?), not a CSV; save it as CSV "
                           "(Excel: File > Save As > CSV UTF-8)")
    for bom, encoding in ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                          (codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
                          (codecs.BOM_UTF16_BE, "utf-16")):
        if raw.startswith(bom):
            try:
                return raw.decode(encoding), encoding
            except UnicodeDecodeError as e:
                raise CsvTextError(f"starts as {encoding.upper()} text but byte {e.start} is not; save it again "
                                   "as CSV UTF-8") from None
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise CsvTextError(f"not UTF-8 text nor any text a spreadsheet writes (byte {nul} is a NUL: a binary "
                           "file?); give a CSV saved as UTF-8")
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError as e:
        utf8_error = e.start
    try:  # Excel's plain "CSV" on Windows: the ANSI code page, Windows-1252 in the West
        return raw.decode("cp1252"), "cp1252"
    except UnicodeDecodeError as e:
        raise CsvTextError(f"not UTF-8 text (byte {utf8_error}) nor Windows-1252 (byte {e.start}); save it "
                           "again as CSV UTF-8") from None


@dataclass
class Table:
    header: List[str]          # column names, stripped
    delimiter: str
    encoding: str
    records: Iterator[Tuple[int, List[str]]]  # (line the record starts on, its fields)

    @property
    def delimiter_name(self) -> str:
        return _NAMES[self.delimiter]


def _rows(text: str, delimiter: str) -> Iterator[Tuple[int, List[str]]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    line = 1
    for fields in reader:
        yield line, fields
        line = reader.line_num + 1


def _header(text: str, delimiter: str) -> List[str]:
    first = next(_rows(text, delimiter), (1, []))[1]
    return [h.strip() for h in first]


def read_table(text: str, needed: Sequence[str], known: Sequence[str] = ()) -> Table:
    """The table in text, its delimiter the one (of DELIMITERS) whose header has every needed
    column; where none has them all, ',' (the caller names what is missing). CsvTextError when
    the header reads more than one way, or names a column of needed or known twice."""
    readings = {d: _header(text, d) for d in DELIMITERS}
    full = [d for d in DELIMITERS if readings[d] and all(c in readings[d] for c in needed)]
    if len(full) > 1:
        raise CsvTextError("its header reads both with " + " and with ".join(_NAMES[d] for d in full)
                           + " as the delimiter; save it with one delimiter (commas) and no "
                           + " or ".join(_NAMES[d] for d in full if d != ",") + " in the column names")
    delimiter = full[0] if full else max(DELIMITERS, key=lambda d: (sum(c in readings[d] for c in needed),
                                                                     d == ","))
    header = readings[delimiter]
    twice = sorted({c for c in header if c and header.count(c) > 1 and (c in needed or c in known)})
    if twice:
        where = "; ".join(f"{c} is columns {', '.join(str(k + 1) for k, h in enumerate(header) if h == c)}"
                          for c in twice)
        raise CsvTextError(f"the header names a column twice ({where}): which one is meant cannot be told; "
                           "rename or remove one")
    records = _rows(text, delimiter)
    next(records, None)  # the header
    return Table(header, delimiter, "", records)


def read_path(path, needed: Sequence[str], known: Sequence[str] = (), gzip_ok: bool = False,
              raw: Optional[bytes] = None) -> Table:
    """read_table of a file's bytes, decoded as decode() says; gzip_ok: a gzip-compressed file
    is read as what it holds (else refused with how to fix it)."""
    data = raw if raw is not None else open(path, "rb").read()
    if gzip_ok:
        data = decompressed(data)
    text, encoding = decode(data, str(path))
    table = read_table(text, needed, known)
    table.encoding = encoding
    return table
