"""The base layer: errors, paths, files, locks, processes, the console, llama-server's flag
vocabulary and the GPU inventory. Imports nothing else of buun's.

Layers: docs/design.md; tests/test_layers.py keeps each import pointing down."""
