"""Engine flags that act on one kind of model, device or backend only (--quantize, --weights, --compile, --kv-layout,
and every local model's flag under `serve --remote` alone). Where the models or the machine make one do nothing, the
command says so instead of ignoring it: a choice the user made (a .gguf, --device cpu, --backend mlx) refuses the flag
in one line (exit 2); one the machine made (--device auto, --backend auto) is a notice on stderr, so that a script
shared between machines still runs."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cli.serve import SESSIONS
from engine.errors import ParleyError
from engine.loading.loader import quantized_folders

# the flags that shape how a local model loads and runs, with the value that leaves each alone (serve's sizes too:
# a remote endpoint keeps its own)
LOCAL_MODEL_FLAGS = {"device": "auto", "dtype": "auto", "kv_layout": "sequence", "backend": "auto", "weights": "auto",
                     "quantize": None, "speculative": "auto", "draft_model": None, "compile": False,
                     "max_sessions": SESSIONS, "context": None}


@dataclass(frozen=True, slots=True)
class Target:
    """What the engine will load and where: the models' paths, the device and backend as the engine resolves them."""
    models: tuple[Path, ...]
    device: str  # "cpu" or "cuda[:n]"
    backend: str  # "torch" or "mlx"
    mlx_device: str = ""  # where MLX runs, whatever --device says: "gpu" (Apple silicon) or "cpu"; "" off MLX

    @classmethod
    def of(cls, args: argparse.Namespace, models: list[Path]) -> "Target":
        """Resolves --device and --backend as the engine will (a missing CUDA device or mlx package: one line)."""
        from engine.backend import resolve_backend, resolve_device
        from engine.loading.gguf_split import model_file

        device, _ = resolve_device(args.device, args.dtype)
        backend = resolve_backend(args.backend, device)
        # as the load reads them: a folder of a split model's GGUF parts is a GGUF file, not a Hugging Face folder
        return cls(tuple(model_file(m) for m in models), device, backend, _mlx_device() if backend == "mlx" else "")

    @property
    def files(self) -> list[Path]:
        return [m for m in self.models if m.is_file()]  # a path that is not there fails the load on its own

    @property
    def folders(self) -> list[Path]:
        return [m for m in self.models if m.is_dir()]


@dataclass(frozen=True, slots=True)
class Unused:
    """A flag that would do nothing: `why`, in words; `chosen`: the user's own choice makes it so (refused)."""
    flag: str  # "--quantize"
    value: str  # as typed ("q8"); "" for a switch
    why: str
    chosen: bool


def check_engine_flags(args: argparse.Namespace, target: Target,
                       notice: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> None:
    """Raises ParleyError ('argument --compile: …') for a flag the user's choices make do nothing; a notice for one the
    machine's do."""
    unused = unused_flags(args, target)
    for u in unused:
        if u.chosen:
            raise ParleyError(f"argument {u.flag}: {u.why}")
    for u in unused:
        notice(f"parley: {u.flag}{f' {u.value}' if u.value else ''} does nothing here: {u.why}")


def unused_flags(args: argparse.Namespace, target: Target) -> list[Unused]:
    if not target.models:  # `serve --remote` alone: nothing loads here
        return _without_local_models(args)
    found = (_quantize(args, target), _weights(args, target), _compile(args, target), _kv_layout(args, target),
             _device(args, target), _dflash(args, target))
    return [u for u in found if u is not None]


def _quantize(args: argparse.Namespace, t: Target) -> Unused | None:
    flag = ("--quantize", args.quantize)
    if not args.quantize:
        return None
    if t.files:
        return Unused(*flag, f"it quantizes a Hugging Face folder's matrices at load; {_names(t.files)} "
                      f"{_is_gguf(t.files)}, whose matrices keep the file's quantization (--weights chooses quantized "
                      "or floats)", chosen=not t.folders)
    if t.device != "cpu":
        return Unused(*flag, f"it quantizes at load on the CPU; on {t.device} a folder's matrices load as floats "
                      "(--device cpu to quantize)", chosen=args.device != "auto")
    return None


def _weights(args: argparse.Namespace, t: Target) -> Unused | None:
    flag = ("--weights", args.weights)
    if args.weights == "quantized" and t.folders and not args.quantize:
        return Unused(*flag, f"it {quantized_folders(_names(t.folders), len(t.folders) > 1)} (--quantize q8|q4 "
                      "quantizes them on the CPU)", chosen=not t.files)
    if args.weights == "dequantized" and args.quantize and t.folders and not t.files:
        return Unused(*flag, f"--quantize {args.quantize} quantizes {_names(t.folders)}; leave out one or the other",
                      chosen=True)
    return None


def _compile(args: argparse.Namespace, t: Target) -> Unused | None:
    if not args.compile:
        return None
    if t.backend == "torch" and t.device.startswith("cuda"):  # its graphs run on the sequence cache (engine/runner.py)
        return None if args.kv_layout == "sequence" else Unused(
            "--compile", "", "it compiles the decode step's CUDA graphs, which run on the sequence cache; --kv-layout "
            "cell runs without them", chosen=True)
    where = ("the MLX backend runs the model" if t.backend == "mlx" else
             "--device cpu runs it on the CPU" if args.device == "cpu" else "there is no CUDA device here")
    return Unused("--compile", "", f"it compiles the CUDA decode step; {where}",
                  chosen=args.device == "cpu" or args.backend == "mlx")


def _kv_layout(args: argparse.Namespace, t: Target) -> Unused | None:
    if args.kv_layout == "cell" and t.backend == "mlx":
        return Unused("--kv-layout", "cell", "the MLX backend keeps its own cache, one block per sequence",
                      chosen=args.backend == "mlx")
    return None


def _device(args: argparse.Namespace, t: Target) -> Unused | None:
    """MLX runs where it runs (Apple silicon's GPU, else the CPU): --device cpu on a Mac picked MLX on the GPU."""
    if t.backend != "mlx" or args.device in ("auto", t.mlx_device):
        return None
    return Unused("--device", args.device, f"the MLX backend runs the model on its own device (here the "
                  f"{t.mlx_device.upper()}); --backend torch runs it on {args.device}", chosen=args.backend == "mlx")


def _dflash(args: argparse.Namespace, t: Target) -> Unused | None:
    """DFlash drafts on torch's CPU and CUDA without compiled graphs (engine/runtime.py dflash_drafter); elsewhere the
    model drafts from the prompt, which the load says in a notice where the machine chose."""
    if args.speculative != "dflash":
        return None
    if t.backend == "mlx" and args.backend == "mlx":
        return Unused("--speculative", "dflash", "DFlash drafts on the torch backend only; on MLX the model would "
                      "draft from the prompt", chosen=True)
    if args.compile and t.backend == "torch" and t.device.startswith("cuda"):
        return Unused("--speculative", "dflash", "DFlash drafts without compiled decode graphs; with --compile the "
                      "model would draft from the prompt", chosen=True)
    return None


def _mlx_device() -> str:
    import mlx.core as mx

    return "gpu" if mx.default_device() == mx.gpu else "cpu"


def _without_local_models(args: argparse.Namespace) -> list[Unused]:
    given = [name for name, unset in LOCAL_MODEL_FLAGS.items() if getattr(args, name, unset) != unset]
    return [Unused("--" + name.replace("_", "-"), "" if getattr(args, name) is True else str(getattr(args, name)),
                   "no local model loads (--remote alone; add --model)", chosen=True) for name in given[:1]]


def _names(paths: list[Path]) -> str:
    return ", ".join(p.name for p in paths)


def _is_gguf(files: list[Path]) -> str:
    return "is a GGUF file" if len(files) == 1 else "are GGUF files"
