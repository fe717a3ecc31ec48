"""Files on disk."""

import hashlib
import os


def tree_digest(directory) -> dict:
    """{relative path: sha256} of every file under `directory`: proof nothing was written."""
    return {os.path.relpath(os.path.join(root, name), directory):
            hashlib.sha256(open(os.path.join(root, name), "rb").read()).hexdigest()
            for root, _, names in os.walk(directory) for name in names}
