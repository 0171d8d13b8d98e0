"""Reproducible benchmarks: each module is runnable as ``python -m benchmarks.NAME``.

Every benchmark writes ``benchmarks/results/NAME.json`` (figures, parameters, machine and
package versions) and ``benchmarks/results/NAME.png``, and prints a table at the end.
"""
