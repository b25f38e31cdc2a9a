"""Running llama-server with DFlash and keeping it running (the server layer: docs/design.md).

    settings.py    the launch plan: a recipe's server settings resolved once, rendered to argv + env
    spec.py        one launch: recipe, models, address, settings, supervision policy; saved for restart
    state.py       the state enum and the record every instance writes
    instance.py    per-instance folder: lock, state file, stale-PID detection
    process.py     spawning in its own group with a death signal, its output, killing groups, ports
    loglines.py    reading llama-server's output: load phases, known failures, a failed launch's error
    logfile.py     the rotating log and reading it back (tail, follow)
    health.py      HTTP probes: /health, /slots, /props, /metrics
    metrics.py     /metrics parsing, the DFlash figures and their change over a request
    local.py       one llama-server for one job (bench, fit --measure, tests): start, ready, stop
    supervise.py   the one loop that owns every state change; beside it supervise_files (the
                   record and locks it keeps), _signals, _workers (lost workers, stalls), _report
    supervisor.py  the supervisor's process (detached, or a systemd unit's)
    control.py     what the CLI does: start detached, stop, restart, status
    addresses.py   RPC workers' HOST:PORT lists, parsed and checked
    rpc.py         the workers from the server's side: probes, devices, placement, connections
    worker.py      an RPC worker, supervised
    service.py     the systemd user unit

llama-server's flag vocabulary is base/command.py; the cards are base/nvidia.py.
"""
