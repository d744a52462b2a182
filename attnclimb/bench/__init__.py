"""Benchmark harness: ``python -m attnclimb bench`` (time rungs and peers) and ``report`` (README table, chart).

Modules: :mod:`.shapes` (shapes, FLOP count), :mod:`.peers` (what can be timed), :mod:`.timing`
(median time, L2 rotation, reference check, host time per call), :mod:`.run` (the bench), :mod:`.dropin`
(the BSHD-view and host-overhead rows), :mod:`.report` (tables and chart).
"""
