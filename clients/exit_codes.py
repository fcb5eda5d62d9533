"""The CLI's exit codes: what a script can tell apart without parsing the message.

====  ===================================================================================
code  meaning
====  ===================================================================================
0     done
1     an error placectl does not classify (a bug: run with ``--debug`` and report it)
2     usage: a bad option or argument, or a configuration or placement that cannot be
      honoured (fix the input; retrying changes nothing)
3     not found: no reservation of that name, or no controller of that name (start one
      with ``placectl start``)
4     conflict: reserved with another configuration, owned by another client, or
      changed or released by another call meanwhile
5     timeout: not satisfied in time, or still degraded (retry later, or give it longer)
6     unavailable: Ray or its GCS does not answer, or the table cannot be read or
      written (retry once the cluster is back; nothing was changed)
130   interrupted (Ctrl-C): a reserve in progress was cancelled and rolled back
====  ===================================================================================
"""

from __future__ import annotations

from controller import errors

OK, UNCLASSIFIED, USAGE, NOT_FOUND, CONFLICT, TIMEOUT, UNAVAILABLE = 0, 1, 2, 3, 4, 5, 6
INTERRUPTED = 130

# Most specific first: the first class an error is an instance of decides.
_CODES: list[tuple[type[Exception], int]] = [
    (errors.UnknownReservation, NOT_FOUND),
    (errors.ControllerNotFound, NOT_FOUND),
    (errors.ReservationConflict, CONFLICT),
    (errors.NotOwner, CONFLICT),
    (errors.StaleReservation, CONFLICT),
    (errors.StaleChange, CONFLICT),
    (errors.ReservationCancelled, CONFLICT),
    (errors.ReservationTimeout, TIMEOUT),
    (errors.ReservationDegraded, TIMEOUT),
    (errors.ClusterUnavailable, UNAVAILABLE),
    (errors.TableUnreadable, UNAVAILABLE),
    (errors.PersistenceError, UNAVAILABLE),
    (errors.PlacementError, USAGE),  # the configuration, a placement, a request
]


def code_of(error: BaseException) -> int:
    """The exit code of a failed command (see the module docstring)."""
    if isinstance(error, KeyboardInterrupt):
        return INTERRUPTED
    for cls, code in _CODES:
        if isinstance(error, cls):
            return code
    if isinstance(error, ConnectionError):
        return UNAVAILABLE
    return UNCLASSIFIED
