"""Checking what `init_structured_logger` is given, before anything is created.

A bad source, output directory or second call is reported here, naming the
cause, so that init either starts everything or nothing. The output
directory is made absolute once: a later ``os.chdir`` (Hydra does one)
cannot move or split the run.
"""

from __future__ import annotations

import os
import re
from typing import Any

from otel_titan.core.options import LoggerOptions
from otel_titan.structured_logger.runtime import Runtime

__all__ = [
    "MAX_SOURCE_BYTES",
    "validate_source",
    "validate_call",
    "absolute_dir",
    "check_output_dir",
    "same_dir",
    "differences",
]

_SOURCE_PATTERN = re.compile(r"[^\W][\w.\-]*")
#: A source names the file: at most this many bytes of UTF-8 (a file name has 255 on most
#: filesystems).
MAX_SOURCE_BYTES = 128


def validate_source(source: object) -> str:
    """`source` names the file: a plain name of at most `MAX_SOURCE_BYTES` bytes, or a clear
    error."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__} {source!r}")
    if not _SOURCE_PATTERN.fullmatch(source):
        raise ValueError(
            f"source {source!r} cannot be used in a file name: use letters, digits, '_', '-' or "
            "'.', not starting with '.' or '-' (no path separators)"
        )
    # Limits on file names are in bytes: 100 CJK characters are 300 bytes.
    size = len(source.encode("utf-8"))
    if size > MAX_SOURCE_BYTES:
        raise ValueError(
            f"source {source[:16]!r}{'...' if len(source) > 16 else ''} is {size} bytes in UTF-8 "
            f"({len(source)} characters); it names the file, so at most {MAX_SOURCE_BYTES} bytes"
        )
    return source


def absolute_dir(output_dir: object) -> str:
    """`output_dir` as an absolute path, resolved against the working directory of now."""
    if not isinstance(output_dir, (str, os.PathLike)):
        raise TypeError(
            f"output_dir must be a path, got {type(output_dir).__name__} {output_dir!r}"
        )
    path = os.fspath(output_dir)
    if not path or "\x00" in path:
        raise ValueError(f"output_dir {path!r} is not a usable path")
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def check_output_dir(output_dir: object) -> str:
    """Create ``output_dir/structured_logs`` and return `output_dir` as an absolute path.

    Absolute once, at init: every later use (the file's path, the writer's
    check that the file still exists, the factories' ``output_dir``) then
    names the same directory after an ``os.chdir``.
    """
    path = absolute_dir(output_dir)
    logs = os.path.join(path, "structured_logs")
    try:
        os.makedirs(logs, exist_ok=True)
    except OSError as error:
        raise OSError(
            error.errno, f"otel-titan: cannot create {logs!r}: {error.strerror}"
        ) from error
    if not os.access(logs, os.W_OK | os.X_OK):
        raise PermissionError(f"otel-titan: output directory {logs!r} is not writable")
    # Tidy ("a/./b/.." → "a") only where that names the same directory: ".." after a symlink may
    # not.
    tidy = os.path.normpath(path)
    try:
        return tidy if tidy == path or os.path.samefile(tidy, path) else path
    except OSError:
        return path


def same_dir(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def differences(
    runtime: Runtime,
    source: str,
    output_dir: object,
    rank: int | None,
    enable: bool,
    options: dict[str, Any],
    parsed: LoggerOptions,
) -> list[str]:
    """What a second `init_structured_logger` call asks for that the running logger does not have.

    An argument left out agrees with anything (a library calling
    ``init_structured_logger(source, output_dir)`` after the training script
    configured more); identity options are compared with what was discovered.
    """
    identity = runtime.identity
    found: list[str] = []
    if not enable:
        found.append("enable=False (the logger is running)")
    if source != identity.source:
        found.append(f"source {source!r} (running: {identity.source!r})")
    directory = absolute_dir(output_dir)
    if not same_dir(directory, runtime.output_dir):
        found.append(f"output_dir {directory!r} (running: {runtime.output_dir!r})")
    if rank is not None and rank != identity.rank:
        found.append(f"rank {rank} (running: {identity.rank})")
    discovered = {
        "world_size": identity.world_size,
        "local_rank": identity.local_rank,
        "run_id": identity.run_id,
        "attempt": identity.attempt,
        "job_id": identity.job_id,
    }
    for name in options:
        value = getattr(parsed, name)
        if name in discovered:
            if value is not None and value != discovered[name]:
                found.append(f"{name}={value!r} (running: {discovered[name]!r})")
            continue
        running = getattr(runtime.options, name)
        if name == "handlers":  # a list or a tuple of the same factories is the same
            value, running = (list(v) if v is not None else None for v in (value, running))
        if value != running:
            found.append(f"{name}={value!r} (running: {running!r})")
    return found


def validate_call(source: object, enable: object, rank: object) -> None:
    """The plain arguments of `init_structured_logger` (its options are `parse_options`'s)."""
    validate_source(source)
    if not isinstance(enable, bool):
        raise TypeError(f"enable must be a bool, got {type(enable).__name__}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
        raise TypeError(f"rank must be an int or None, got {type(rank).__name__} {rank!r}")
