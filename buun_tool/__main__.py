"""`python -m buun_tool` and the `buun` script. The CLI's modules are imported inside the
handler: a Ctrl-C while they load (a second or more) is an interruption like any other."""

from buun_tool.errors import exit_interrupted


def main() -> None:
    try:
        from buun_tool.cli.app import main as cli_main
    except KeyboardInterrupt:
        exit_interrupted()
    cli_main()


if __name__ == "__main__":
    main()
