"""Entry point of the packaged app (PyInstaller): `parley` with all its subcommands, plus `--version`."""
from __future__ import annotations

import os
import sys


def _version() -> str:
    here = getattr(sys, "_MEIPASS", os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(here, "parley_version.txt"), encoding="utf-8") as f:
            return f.read().strip()
    except OSError:  # running from a source checkout: pyproject.toml is the source of truth
        sys.path.insert(0, here)
        import config

        return config.version()


def main() -> int:
    if not any(os.environ.get(k) for k in ("LC_ALL", "LC_CTYPE", "LANG")):
        os.environ["LC_CTYPE"] = "C.UTF-8"  # a bare environment (env -i, some launchers): Qt wants UTF-8
    if sys.argv[1:] == ["--version"]:
        print(f"Parley {_version()}")
        return 0
    from cli.main import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
