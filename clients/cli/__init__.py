"""The ``placectl`` command line.

Every command that prints a result takes ``-o table|json|yaml``; every failure prints one
line, ``placectl: error: ...``, naming the input at fault, and exits with the code of
:mod:`clients.exit_codes` (2 usage, 3 not found, 4 conflict or not owner, 5 timeout,
6 cluster unavailable); ``placectl --debug ...`` shows the traceback behind it.

Rooms: :mod:`~clients.cli.app` (the group, options, output, errors),
:mod:`~clients.cli.reservations`, :mod:`~clients.cli.queues` and
:mod:`~clients.cli.nodes` (the commands).
"""

from clients.cli import nodes, queues, reservations  # noqa: F401  (they register commands)
from clients.cli.app import cli, main

__all__ = ["cli", "main"]
