"""The `buun` command line: thin commands over the stage functions in buun_tool."""
