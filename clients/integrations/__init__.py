"""Adapters that run the frameworks users already have on placectl. Each one is imported
only when used; the frameworks are not dependencies of placectl."""
