"""`python -m buun_tool` and the `buun` script. The CLI's modules are imported, and typer builds
its commands, inside the handler: a Ctrl-C while they load or while typer reads the commands'
signatures (together a good part of a short command's run) is an interruption like any other.
SIGTERM and SIGHUP unwind the same way (errors.Terminated), from the first line on."""

import signal

from buun_tool.base.errors import Terminated, exit_interrupted, exit_terminated, raise_terminated


def main() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):  # a handler, not SIG_IGN: children get the default back at exec
        signal.signal(sig, raise_terminated)
    try:
        from buun_tool.base.cmdline import mask_secrets

        mask_secrets()  # `buun serve --api-key KEY` lives as long as its server: off `ps` at once
        from buun_tool.cli.app import main as cli_main

        cli_main()
    except Terminated as exc:
        exit_terminated(exc)
    except KeyboardInterrupt:
        exit_interrupted()
    except RuntimeError as exc:  # a Ctrl-C inside a descriptor's __set_name__ while a class is made
        if isinstance(exc.__cause__, KeyboardInterrupt):
            exit_interrupted()
        if isinstance(exc.__cause__, Terminated):
            exit_terminated(exc.__cause__)
        raise


if __name__ == "__main__":
    main()
