"""The `buun` command line (the top layer): thin commands over the layers below (docs/design.md)."""
