"""The pure planning core: configuration, rank grammar, cluster views, strategies and
the component placement. Imports no Ray: it runs in milliseconds in unit tests and in
dry runs on a laptop.

Dependency order (each imports only those above it): ``documents`` -> ``ranks`` ->
``spec`` -> ``cluster`` -> ``node_groups`` -> ``colocation`` -> ``placement`` ->
``strategies`` -> ``components``.
"""
