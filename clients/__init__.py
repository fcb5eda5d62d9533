"""What drivers and workers import: the ``placectl`` CLI and, from the cluster-side
issues on, attaching to the controller, reservations and worker groups.

Importing this package does not import Ray.
"""
