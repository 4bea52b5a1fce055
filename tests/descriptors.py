"""A snippet for test scripts run in a subprocess: from where it runs on, every file descriptor is taken (a server
whose clients hold them all), so any file the script opens fails with OSError(24)."""

TAKE_EVERY_DESCRIPTOR = """
import os as _os, resource as _resource
_resource.setrlimit(_resource.RLIMIT_NOFILE,
                    (len(_os.listdir("/proc/self/fd")) + 8, _resource.getrlimit(_resource.RLIMIT_NOFILE)[1]))
_held = []
try:
    while True:
        _held.append(_os.open(_os.devnull, _os.O_RDONLY))
except OSError:
    pass
"""
