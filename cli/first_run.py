"""What a first run says on stderr before its slow part where no progress line shows it: `parley serve`, and
`parley generate` / `chat` with stderr no terminal. The CPU kernels' build took 21 s of silence before serve's first
line ("parley: serving ...")."""
from __future__ import annotations

import argparse

from cli.engine_flags import Target


def kernel_build_note(args: argparse.Namespace, target: Target) -> str | None:
    """A line saying the load builds the CPU kernels first, where it will: a GGUF model kept quantized by torch on
    the CPU (engine/loading/loader.py), and no library built here yet. None otherwise."""
    from kernels.cpu_native import builds_first

    quantized_gguf = args.weights != "dequantized" and any(path.suffix == ".gguf" for path in target.models)
    if quantized_gguf and target.device == "cpu" and target.backend == "torch" and builds_first():
        return "building Parley's CPU kernels before the first load (once for this computer: up to a minute)"
    return None
