"""The pipeline's stages, in the order `buun setup` runs them: doctor, vendor, patch, build,
pull, drafter, convert; each a plain function with its own records (stage.py).

Layers: docs/design.md; tests/test_layers.py keeps each import pointing down."""
