"""PyInstaller runtime hook: the bundle's programs are its own, the system's programs get the system's libraries.

The bootloader puts the bundle's _internal/ first on LD_LIBRARY_PATH (keeping the user's value in
LD_LIBRARY_PATH_ORIG), and every child inherits it: the CPU kernels' `cc` (and its cc1, as, ld) and xdg-open (a /bin/sh
script, for a link in an answer) then load the bundle's libz, libzstd or libreadline in place of the system's, which
breaks them on a newer distribution. The dynamic loader read the variable at this process's start, so the bundle's
own libraries still load from _internal/.
"""
import os
import sys


def restore_library_path(environ: dict) -> None:
    """Gives `environ` the library path the user had before the bootloader changed it."""
    original = environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is not None:
        environ["LD_LIBRARY_PATH"] = original
    else:
        environ.pop("LD_LIBRARY_PATH", None)


if getattr(sys, "frozen", False) and sys.platform.startswith("linux"):
    restore_library_path(os.environ)
