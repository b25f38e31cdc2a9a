"""Planning a launch: GPU memory (fit), the split over cards (split), and where the target and
the drafter go (devices). Reads the stages' results; starts nothing.

Layers: docs/design.md; tests/test_layers.py keeps each import pointing down."""
