"""The bottom layer: what every part uses and that knows no other part.

Metrics, the memory budget and heap trimming, systemd notify, close codes, asyncio and
thread helpers, the plain settings and message types, box agreement and frame sources.
Nothing here imports ``edge_vision.session``, ``frames``, ``engines`` or above
(pyproject.toml's import contracts check it).
"""
