"""Running llama-server with DFlash and keeping it running.

    command.py     the llama-server argv: recipe flags + overrides, aliases, secrets (pure functions)
    spec.py        one launch: recipe, models, argv, supervision policy; saved for restart
    state.py       the state enum and the record every instance writes
    instance.py    per-instance folder: lock, state file, stale-PID detection
    process.py     spawning in its own group with a death signal, killing groups, port holders
    loglines.py    reading llama-server's output: load phases and known failures
    logfile.py     the rotating log and reading it back (tail, follow)
    health.py      HTTP probes: /health, /slots, /props, /metrics
    metrics.py     /metrics parsing and the DFlash figures
    supervisor.py  the one loop that owns every state change
    control.py     what the CLI does: start detached, stop, restart, status
    service.py     the systemd user unit
"""
