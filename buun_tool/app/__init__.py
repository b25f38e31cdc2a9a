"""What runs the whole chain: `buun setup`, the stages and the server in order.

Layers: docs/design.md; tests/test_layers.py keeps each import pointing down."""
