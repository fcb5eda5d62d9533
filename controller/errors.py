"""The errors placectl raises.

Every problem with a configuration or a plan is a :class:`PlacementError`; its message is
one line that quotes the offending input and says what is allowed. Nothing in placectl
uses ``assert`` to check user input.
"""

from __future__ import annotations


class PlacementError(ValueError):
    """A configuration, placement string or plan that placectl cannot honour."""


class SpecError(PlacementError):
    """The ``cluster:`` block is malformed: wrong type, unknown or missing key."""


class PlacementStringError(PlacementError):
    """A ``resource_ranks[:process_ranks]`` string breaks the grammar or its rules."""


class ColocationError(PlacementError):
    """The processes sharing an accelerator request more than all of it."""
