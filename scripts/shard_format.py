"""shard_format.py: read and write token shards in llm.c's format.

A shard is a header of 256 little-endian int32 followed by the tokens:
    header[0] = 20240520 (magic), header[1] = 1 (version: uint16 tokens),
    header[2] = number of tokens N (1 <= N <= 2**31 - 1), the rest zero;
then N little-endian uint16 tokens. File size is therefore exactly 1024 + 2 * N bytes.
data/dataloader.h reads the same format in C.
"""
import os
import tempfile

import numpy as np

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MAX_SHARD_TOKENS = 2**31 - 1  # header[2] is an int32


class ShardError(ValueError):
    """A file is not a valid shard; the message names the file and the problem."""


def write_shard(path, tokens):
    """Writes tokens (any integer array with values < 2**16) as a shard at path.

    The data goes to a temporary file in the same folder, renamed into place at the
    end, so an interrupted run never leaves a half-written shard under the real name.
    """
    tokens = np.asarray(tokens)
    n = int(tokens.size)
    if not 0 < n <= MAX_SHARD_TOKENS:
        raise ShardError(f"{path}: a shard holds 1 to {MAX_SHARD_TOKENS} tokens, not {n}")
    if tokens.min() < 0 or tokens.max() >= 2**16:
        raise ShardError(f"{path}: tokens must fit in uint16 (got {tokens.min()}..{tokens.max()})")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, n
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header.tobytes())
            f.write(tokens.astype("<u2", copy=False).tobytes())
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)  # mkstemp makes the file 0600; give it the usual 0666 & ~umask
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_header(path):
    """Returns the 256-int header of a shard after checking magic, version and size."""
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != SHARD_MAGIC:
        raise ShardError(f"{path}: bad magic {header[0]} (expected {SHARD_MAGIC})")
    if header[1] != SHARD_VERSION:
        raise ShardError(f"{path}: unsupported version {header[1]} (expected {SHARD_VERSION})")
    n = int(header[2])
    if n <= 0:
        raise ShardError(f"{path}: header token count {n} (must be > 0)")
    expected = HEADER_BYTES + 2 * n
    if size != expected:
        what = "truncated" if size < expected else "trailing bytes"
        raise ShardError(f"{path}: {what}: size {size} bytes, header says {n} tokens = {expected} bytes")
    return header


def read_shard(path):
    """Returns the tokens of a shard as a uint16 array, after the checks of read_header."""
    header = read_header(path)
    return np.fromfile(path, dtype="<u2", offset=HEADER_BYTES, count=int(header[2]))
