"""The supervisor's process: `python -m buun_tool.server.supervisor NAME --lock-fd N --guard-fd M`,
run detached by `buun start` (control.launch), or `... NAME --spec FILE` by a systemd unit, which
launches the launch spec `buun service install` saved as `buun serve` does. The loop itself is
supervise.py's Supervisor; `buun serve` runs it in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path

from buun_tool.base.errors import BuunError, Exit, NotReadyError
from buun_tool.server import control
from buun_tool.server.instance import Instance
from buun_tool.server.settings import API_KEY_ENV
from buun_tool.server.spec import LaunchSpec
from buun_tool.server.supervise import Supervisor, detached_output, report


def _load_saved(path: Path) -> LaunchSpec:
    """A launch spec saved by `buun service install`, or an error that says how to make it again."""
    try:
        return LaunchSpec.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        raise NotReadyError(f"no saved launch spec at {path}", "run `buun service install` again") from None
    except (json.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
        raise NotReadyError(f"the launch spec {path} is not one this buun reads ({exc})",
                            "it was saved by another version of buun: run `buun service install --force` "
                            "with the options you want") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m buun_tool.server.supervisor",
                                     description="Supervise one instance: detached for `buun start` (--lock-fd), "
                                     "or in the foreground on a saved launch spec for its systemd unit (--spec).")
    parser.add_argument("name")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--lock-fd", type=int, help="inherited fd holding the instance lock (buun start)")
    how.add_argument("--spec", type=Path, help="launch this saved spec, as `buun serve` does (the systemd unit)")
    parser.add_argument("--guard-fd", type=int, help="inherited fd holding the instance's guard, with --lock-fd")
    args = parser.parse_args(argv)
    listener = report
    try:
        if args.spec is not None:
            spec = _load_saved(args.spec)
            spec.run_id = uuid.uuid4().hex
            control.launch(spec, os.environ.get(API_KEY_ENV), foreground=report)
            return 0
        inst = Instance(args.name)
        data = inst.read_spec()
        if data is None:
            print(f"no launch spec in {inst.spec_file}", file=sys.stderr)
            return int(Exit.NOT_READY)
        try:
            spec = LaunchSpec.from_json(data)
            listener = detached_output(inst, spec.policy)
            Supervisor(spec, inst, os.environ.get(API_KEY_ENV), listener, args.lock_fd).run()
        finally:
            os.close(args.lock_fd)
            if args.guard_fd is not None:
                os.close(args.guard_fd)
    except BuunError as exc:
        listener("failed", f"{exc.message}" + (f" ({exc.hint})" if exc.hint else ""))
        return int(exc.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
