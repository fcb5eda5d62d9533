"""A local multi-node Ray cluster to test placectl and the jobs on it, as
``ray.cluster_utils`` is Ray's: machines that fail as real ones do
(:mod:`clients.testing.machines`) and a head that restarts over a kept GCS
(:mod:`clients.testing.head`). Used by placectl's own tests, chaos runs and
benchmarks; nothing in a driver or worker imports it."""
