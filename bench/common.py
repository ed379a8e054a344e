"""Helpers the bench scripts share (imported from bench/, the scripts' own
directory, which Python puts first on the module path)."""

import hashlib


def sha(path):
    """The SHA-256 of a file, hex, read 1 MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()
