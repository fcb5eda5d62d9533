"""The controller actor and everything it does to the cluster, in four layers, each
importing only those below it (``tests/unit/test_layers.py`` holds them to it):

* :mod:`controller.runtime.edge`: Ray and the network, behind one seam,
  :class:`~controller.runtime.edge.ClusterIO` (:mod:`~controller.runtime.edge.ray_io` is
  the real cluster, :mod:`clients.testing.fake_cluster` an in-memory one); the only
  layer that imports Ray;
* :mod:`controller.runtime.core`: what every step works on: the records' owner and its
  stewards, the table, the nodes, the settings, the task registry and the clock;
* :mod:`controller.runtime.steps`: what the controller does: reserve, admit, check,
  repair, hold spares, lease, apply, and the loop's pass;
* the calls at the top: :mod:`~controller.runtime.controller` (the actor: routes and the
  loop), :mod:`~controller.runtime.reads` and :mod:`~controller.runtime.changes`.

The controller imports no Ray above the edge, so unit tests run it against the fake
cluster on a virtual clock.
"""
