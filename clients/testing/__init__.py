"""A local multi-node Ray cluster to test placectl and the jobs on it, as
``ray.cluster_utils`` is Ray's: machines that fail as real ones do
(:mod:`clients.testing.machines`), a head that restarts over a kept GCS
(:mod:`clients.testing.head`), an autoscaler that launches nodes as pods
(:mod:`clients.testing.autoscaler`).

It ships with placectl and is public, for users who test their own jobs the way
placectl's tests, chaos runs, benchmarks and the demo test it; its packages come with the
``testing`` extra (``pip install 'placectl[testing]'``). Nothing a driver or a worker
imports needs it.
"""

try:
    import psutil  # noqa: F401  (the machines' process tables)
except ModuleNotFoundError as e:  # Ray vendors its own psutil and does not install one
    raise ModuleNotFoundError(
        "clients.testing needs psutil, which placectl's `testing` extra installs: "
        "pip install 'placectl[testing]'",
        name="psutil",
    ) from e
