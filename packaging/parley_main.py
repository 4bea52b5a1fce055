"""Entry point of the packaged app (PyInstaller): `parley` with all its subcommands, plus `--version`."""
from __future__ import annotations

import os
import sys


def _version() -> str:
    here = getattr(sys, "_MEIPASS", os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(here, "parley_version.txt"), encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        from importlib.metadata import version

        return version("parley")


def main() -> int:
    if sys.argv[1:] == ["--version"]:
        print(f"Parley {_version()}")
        return 0
    from app.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
