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
import logging

import msgspec

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


class Caller(msgspec.Struct, frozen=True):
    """Who asks for a change of a reservation. The operation checks it against the
    record it reads under the job's lock, so the record it changes is the record whose
    owner was checked (a check before the lock could pass on a job that did not exist
    yet, then change the one another client reserved meanwhile).

    Attributes:
        token: the caller's token ("" for none).
        force: change it even without the owner's token (logged).
    """

    token: str = ""
    force: bool = False

    def may(self, record: ReservationRecord, what: str) -> None:
        """Allow ``what`` on ``record``.

        Raises:
            NotOwner: the caller does not hold the owner's token and did not force it.
        """
        if check_owner(record, self.token, self.force, what):
            logging.getLogger("placectl.controller").warning(
                "%s of %r forced by a caller without its owner's token", what, record.job
            )


__all__ = ["Caller", "check_owner", "owner_hash", "owns"]
