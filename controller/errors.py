"""The errors placectl raises.

Every problem with a configuration or a plan is a :class:`PlacementError`; its message is
one line that quotes the offending input and says what is allowed. Cluster-side failures
are :class:`ReservationError` subclasses, which are PlacementErrors too, so a caller can
catch everything placectl refuses with one ``except``. Nothing in placectl uses
``assert`` to check user input.
"""

from __future__ import annotations


class PlacementError(ValueError):
    """A configuration, placement string or plan that placectl cannot honour."""


class SpecError(PlacementError):
    """The ``cluster:`` block is malformed: wrong type, unknown or missing key."""


class SettingsError(PlacementError):
    """A controller setting given by variable or ``--set`` is unknown or out of range."""


class PlacementStringError(PlacementError):
    """A ``resource_ranks[:process_ranks]`` string breaks the grammar or its rules."""


class ColocationError(PlacementError):
    """The processes sharing an accelerator request more than all of it."""


class ReservationError(PlacementError):
    """A reservation request the controller cannot carry out."""


class ReservationTimeout(ReservationError):
    """The cluster could not satisfy a reservation within its timeout."""


class UndecidedNodes(ReservationTimeout):
    """A repair waited its whole timeout for a verdict on the nodes of ranks that do not
    answer, and none came (the nodes are cut off, or the controller suspects itself):
    nothing is known of those ranks, so none was relaunched or reported kept.

    Attributes:
        nodes: the node ids still without a verdict.
    """

    def __init__(self, message: str, nodes: list[str] | None = None) -> None:
        super().__init__(message)
        self.nodes = list(nodes or [])

    def __reduce__(self):  # crosses Ray with its nodes
        return (type(self), (str(self), self.nodes))


class ReservationConflict(ReservationError):
    """The job name is reserved already with a different specification."""


class UnknownReservation(ReservationError):
    """No reservation of that job name exists."""


class ControllerNotFound(ReservationError):
    """No placectl controller of that name runs in that namespace (and none was to be
    started): start one with ``placectl start`` or ``connect(start=True)``."""


class ReservationCancelled(ReservationError):
    """A pending reservation was cancelled (by ``release`` or the caller) and rolled back."""


class ReservationDegraded(ReservationError):
    """The reservation holds a node Ray reports dead (or a group it lost) and is not
    repaired yet: its assignments would name bundles that cannot run anything."""


class StaleReservation(ReservationError):
    """The reservation changed identity (released, replaced) since it was read."""


class StaleChange(ReservationError):
    """A change to a job's record was built on a record another change has replaced
    since (or is writing now); it was refused and nothing was written. A controller
    bug, never a user's: every writer holds the job's lock."""


class TableUnreadable(ReservationError):
    """The persisted reservation table cannot be read (corrupt, or from a newer placectl).

    The controller then refuses to act rather than risk removing what it cannot see.
    """


class PersistenceError(ReservationError):
    """Writing the reservation table to the GCS failed; nothing was changed."""


class ClusterUnavailable(ReservationError):
    """Ray's GCS did not answer within the bound (the head node is down or restarting);
    nothing was changed."""


class ReservationInfeasible(ReservationError):
    """The reservation asks a node for more than the node has in total: it can never be
    placed, so it is refused at once instead of waiting for its timeout."""


class NotOwner(ReservationError):
    """A change to a reservation by a caller without its owner's token (and no force)."""
