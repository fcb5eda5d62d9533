"""Who may change a reservation.

A reservation records its owner as a hash of a token its creating client keeps (the
token itself is never stored or logged). ``release``, ``apply``, ``resize``, ``repair``,
port leases and a ``reserve`` that replaces another spec need that token, or ``force``;
reading and attaching stay open. Ray has no authentication inside a cluster, so this
guards against mistakes (a colleague's ``placectl release --all``), not against attackers:
anyone who can run code in the cluster can read the table or kill the controller.
"""

from __future__ import annotations

import hashlib

from controller.errors import NotOwner
from controller.state.records import ReservationRecord


def owner_hash(token: str) -> str:
    """What the table keeps of a token ("" for none: the reservation is anyone's)."""
    if not token:
        return ""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def owns(record: ReservationRecord, token: str) -> bool:
    """Whether ``token`` may change ``record`` (a record without an owner: anyone)."""
    return not record.owner or owner_hash(token) == record.owner


def check_owner(record: ReservationRecord, token: str, force: bool, what: str) -> bool:
    """Allow ``what`` on ``record``; True when it is allowed only because of ``force``.

    Raises:
        NotOwner: the caller does not hold the owner's token and did not force it.
    """
    if owns(record, token):
        return False
    if force:
        return True
    raise NotOwner(
        f"{what} of {record.job!r} refused: it was reserved by another client (a different "
        "placectl token); use its owner's token (PLACECTL_TOKEN) or force=True (--force)"
    )


__all__ = ["check_owner", "owner_hash", "owns"]
