"""The `deepline` command's entry (`python -m deepline_cli` runs it too).

`deepline_cli.cli` installs the Ctrl-C handling as its first act; a Ctrl-C while that
module is still being imported arrives as Python's KeyboardInterrupt: one line, exit 130,
never a traceback. Nothing else runs before it: this module imports nothing at its top.
"""


def entry() -> None:
    try:
        from deepline_cli.cli import install, main

        install()
    except KeyboardInterrupt:  # before the handlers were in: nothing has started
        import os

        os.write(2, b"Interrupted.\n")
        raise SystemExit(130) from None
    main()


if __name__ == "__main__":
    entry()
