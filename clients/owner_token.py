"""The token that makes a client the owner of the reservations it creates.

Resolved once per client, in this order: the ``token`` given to ``connect``; the
``PLACECTL_TOKEN`` variable (set it in workers, CI jobs, or a second machine that must
manage the same jobs); the file ``~/.config/placectl/token`` (``PLACECTL_TOKEN_FILE``
overrides the path), created with a random token on first use and readable by its user
only. So one user's drivers and CLI on one machine, and restarted drivers, own what they
reserved. The controller keeps only a hash of it (:mod:`controller.state.change`).
"""

from __future__ import annotations

import os
import pathlib
import secrets


def token_file() -> pathlib.Path:
    path = os.environ.get("PLACECTL_TOKEN_FILE")
    return pathlib.Path(path) if path else pathlib.Path.home() / ".config" / "placectl" / "token"


def resolve_token(explicit: str | None = None) -> str:
    """The caller's owner token (see the module docstring)."""
    if explicit:
        return explicit
    if os.environ.get("PLACECTL_TOKEN"):
        return os.environ["PLACECTL_TOKEN"]
    path = token_file()
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    try:
        os.link(partial, path)  # atomic: the first of several racing clients wins
    except FileExistsError:
        token = path.read_text().strip()
    finally:
        partial.unlink()
    return token


__all__ = ["resolve_token", "token_file"]
