"""Measuring: synthetic models, benchmarks, their figures, reports and comparisons.

Layers: docs/design.md; tests/test_layers.py keeps each import pointing down."""
