"""The lab: developer micro-benchmarks, one module each, run as ``python -m benchmarks.NAME``
from a checkout (they are not installed with the package). Their figures, with date and
machine, are in docs/benchmarks.md; what users run to measure a node is ``edge-vision bench``.
"""
