"""The process tests/gcs_server.py starts: gcp-storage-emulator (2026.7.19), with the body of a multipart upload
kept byte for byte.

The emulator parses ``uploadType=multipart`` bodies with Python's ``email`` parser, which takes the line break
before a boundary as ``(\\r\\n|\\r|\\n)`` at the end of the part. gcsfs separates the parts with ``\\n``
(``gcsfs.core.simple_upload``), so an object whose last byte is ``\\r`` followed by that ``\\n`` loses its last
byte: the parser strips ``\\r\\n``. GCS itself keeps it. An upload ends in ``\\r`` about once in 256 random endings
(a TensorBoard event file ends in a CRC), and the test that read such a file back found a truncated record. Here
the object's bytes are cut from the body at the delimiters, RFC 2046's line break + ``--`` + boundary, with the line
break the body's first boundary line ends with; everything else is the emulator's own.

Run as ``python tests/gcs_emulator_exact.py <the emulator's arguments>``."""

from __future__ import annotations

import sys
from email.message import Message

__all__ = ["exact_content", "main"]


def exact_content(body: bytes, content_type: str) -> bytes:
    """The second part's content (the object's bytes) of a ``multipart/related`` upload ``body``, byte for byte."""
    header = Message()
    header["Content-Type"] = content_type
    delimiter = b"--" + str(header.get_param("boundary")).encode()
    start = body.index(delimiter) + len(delimiter)
    eol = b"\r\n" if body[start:start + 2] == b"\r\n" else b"\n"
    parts = body[start:].split(eol + delimiter)  # metadata, content, closing "--" (and any epilogue)
    if len(parts) < 3:
        raise ValueError(f"a multipart upload with {len(parts) - 1} part(s), not 2")
    content = parts[1][len(eol):]  # after the boundary line: the part's headers, an empty line, the object
    return content[content.index(eol + eol) + 2 * len(eol):]


def _patch() -> None:
    from gcp_storage_emulator import server

    read_raw, read_data = server._read_raw_data, server._read_data

    def keep_raw(handler):
        handler.tfnet_raw = raw = read_raw(handler)
        return raw

    def exact(handler, query):
        data = read_data(handler, query)
        content_type = handler.headers.get("Content-Type") or ""
        if content_type.startswith("multipart/related") and isinstance(data, dict) and "content" in data:
            data["content"] = exact_content(server._decode_raw_data(handler.tfnet_raw, handler), content_type)
        return data

    server._read_raw_data, server._read_data = keep_raw, exact


def main(argv: list[str]) -> None:
    _patch()
    from gcp_storage_emulator.__main__ import main as emulator_main

    emulator_main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
