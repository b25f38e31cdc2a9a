"""Formats: recipes and GGUF files, read and checked. Imports only the base.

Layers: docs/design.md; tests/test_layers.py keeps each import pointing down."""
