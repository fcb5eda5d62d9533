"""The Ray edge: the controller actor and everything it does to the cluster.

All Ray calls go through :class:`~controller.runtime.io.ClusterIO`
(:mod:`controller.runtime.ray_io` is the real one, :mod:`clients.testing.fake_cluster` an
in-memory cluster). The controller (:mod:`controller.runtime.controller`) is a plain
class composed of ``reserving``, ``reconcile``, ``repair`` and ``leasing``; it imports
no Ray itself, so unit tests run it against the fake cluster in milliseconds.
"""
