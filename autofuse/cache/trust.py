"""What the cache trusts: bounded reads of its files, and signatures where a key is set.

Digests (sha256 beside the data) detect damage: a flipped bit, a truncated or half-written
file. They do not detect tampering: whoever can write the cache can recompute them. With
``AUTOFUSE_SIGNING_KEY`` set, every plan entry, call record, compiled binary and bundle
manifest carries an HMAC-SHA256 of its digest under that key, and readers refuse what the key
did not sign: a forged entry (kernel edited, digests recomputed) never runs.

Readers never block or exhaust memory on a cache file: :func:`read_bounded` opens without
following a link and without blocking (a FIFO), checks the opened file is a regular file of at
most ``limit`` bytes, and reads at most that.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path

from autofuse.settings import settings

PLAN_LIMIT = 64 << 20  # plan.json: graphs of thousands of nodes stay far below
SOURCE_LIMIT = 8 << 20  # one kernel's source
CALL_LIMIT = 4 << 20  # one call record
BINARY_LIMIT = 256 << 20  # one compiled binary record (base64)
BUNDLE_LIMIT = 1 << 30  # one bundle file, and the sum of its members' sizes
MEMBER_LIMIT = BINARY_LIMIT  # one member of a bundle, decompressed


class UnsafeFile(OSError):
    """A cache file that is not a regular file (a link, FIFO, device) or is too large."""


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``); :class:`UnsafeFile` for a
    link, FIFO, device or folder, or a file over ``limit`` bytes; FileNotFoundError passes."""
    try:
        f = open_regular(path, limit, follow=False)
    except OSError:
        if os.path.islink(path):
            raise UnsafeFile(
                f"{path} is a symbolic link; cache files must be regular files"
            ) from None
        raise
    with f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(f"{path} grew past the {limit}-byte limit while it was read")
    return data


def open_regular(path: Path, limit: int, follow: bool = True):
    """``path`` opened for reading (binary) after checking the opened file is a regular file of
    at most ``limit`` bytes (without blocking on a FIFO); :class:`UnsafeFile` otherwise."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path} is not a regular file (a FIFO, device or folder)")
        if st.st_size > limit:
            raise UnsafeFile(f"{path} is {st.st_size} bytes, over the {limit}-byte limit")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def signing_key() -> bytes | None:
    """``AUTOFUSE_SIGNING_KEY`` (None: nothing is signed or required to be)."""
    return settings().signing_key


def sign(purpose: str, digest: str) -> str | None:
    """The signature of ``digest`` for ``purpose`` under the signing key (None without one)."""
    key = signing_key()
    if key is None:
        return None
    mac = hmac.new(key, f"autofuse-{purpose}\0{digest}".encode(), hashlib.sha256)
    return "hmac-sha256:" + mac.hexdigest()


def signature_problem(purpose: str, digest: str, signature: object) -> str | None:
    """Why ``signature`` does not authenticate ``digest`` (None: it does, or no key is set)."""
    want = sign(purpose, digest)
    if want is None:
        return None
    if not isinstance(signature, str):
        return "is not signed, and AUTOFUSE_SIGNING_KEY requires a signature"
    if not hmac.compare_digest(want, signature):
        return "has a signature that AUTOFUSE_SIGNING_KEY did not make (forged or another key)"
    return None
