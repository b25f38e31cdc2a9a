"""Running llama-server with DFlash and keeping it running.

    command.py     every llama-server argv: recipe flags + overrides, the alias table, secrets (pure functions)
    spec.py        one launch: recipe, models, argv, supervision policy; saved for restart
    state.py       the state enum and the record every instance writes
    instance.py    per-instance folder: lock, state file, stale-PID detection
    process.py     spawning in its own group with a death signal, its output, killing groups, ports
    loglines.py    reading llama-server's output: load phases, known failures, a failed launch's error
    logfile.py     the rotating log and reading it back (tail, follow)
    health.py      HTTP probes: /health, /slots, /props, /metrics
    metrics.py     /metrics parsing, the DFlash figures and their change over a request
    gpu.py         GPU memory from nvidia-smi: a server's, the cards', the peak over a run
    local.py       one llama-server for one job (bench, fit --measure, tests): start, ready, stop
    supervisor.py  the one loop that owns every state change
    control.py     what the CLI does: start detached, stop, restart, status
    service.py     the systemd user unit
"""
