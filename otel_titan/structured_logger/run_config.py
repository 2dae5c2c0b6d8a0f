"""What is the same on every rank, written in full once per job; every rank writes its hash.

torchtitan's users saw a 2,048-rank run write 8 GB of logs, 85 % of it per-rank
copies of the same configuration dump. `log_run_config` writes a
``run_config`` record on every rank with the configuration's name, its hash
(sha256 of its canonical JSON, sorted keys) and size, and the content itself
only in the file of the *first* rank that logs that content, whichever rank it
is (rank 0 may never start): the ranks race for a claim file
``structured_logs/.run_config/<name>-<hash>`` created with ``O_EXCL`` on the
run's shared output directory, and exactly one wins per distinct content. A
rank whose configuration differs has another hash, so it wins the claim of its
own content too: its file has the full differing configuration, and
`otel_titan.analysis.model.config_drift` names it (configuration drift).

``per="host"`` writes the content once per host instead (host facts: CPU
model, driver versions): the claim name then carries the host name.

When the output directory is not shared between hosts (node-local disks), each
host's first rank writes the content: at most once per host, still not once
per rank. The claim costs one file creation on the calling thread, once per
call: meant for start-up, not for every step.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from otel_titan.core import capture
from otel_titan.structured_logger.runtime import STATE

__all__ = ["log_run_config", "config_hash", "canonical_json", "RUN_CONFIG", "CLAIMS_DIR"]

_log = logging.getLogger("otel_titan")

#: The record's ``log_type_name``.
RUN_CONFIG = "run_config"
#: The claim files' folder, under ``structured_logs/``.
CLAIMS_DIR = ".run_config"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def canonical_json(config: Any) -> str:
    """`config` as compact JSON with sorted keys (non-JSON values as their ``str``): equal
    configurations, equal text.

    Example:
        >>> canonical_json({"b": 1, "a": [1.5, None]})
        '{"a":[1.5,null],"b":1}'
    """
    return json.dumps(
        config, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False
    )


def config_hash(text: str) -> str:
    """The first 16 hex digits of the sha256 of `text` (64 bits: a collision among a job's
    configurations is not a concern).

    Example:
        >>> config_hash('{"a":1}')
        '015abd7f5cc57a2d'
    """
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _claim(directory: str, key: str) -> bool:
    """True for the first process to claim `key` in the run's folder (O_EXCL); False if another has,
    or on error."""
    folder = os.path.join(directory, "structured_logs", CLAIMS_DIR)
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, key), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError as error:
        # Cannot tell whether another rank wrote it: write it here (a copy too many beats none).
        _log.warning(
            "otel-titan: cannot claim %s in %s (%s); this rank writes the configuration in full",
            key,
            folder,
            error,
        )
        return True
    os.close(fd)
    return True


def log_run_config(name: str, config: Mapping[str, Any] | Any, *, per: str = "job") -> str | None:
    """Record `config` (a mapping, or anything JSON-serialisable) under `name`: in full once per
    job, its hash on every rank.

    Args:
        name: what it is (``"job_config"``, ``"environment"``); letters, digits, ``_ . -``.
        config: the configuration; serialised as canonical JSON (sorted keys;
            a value JSON cannot hold becomes its ``str``).
        per: ``"job"`` (the content once per job) or ``"host"`` (once per host).

    Returns the hash, or None when the logger is not running (nothing recorded).

    Raises ``ValueError`` for a bad `name` or `per`.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.log_run_config("job_config", {"lr": 3e-4, "layers": 32}) is None  # not initialised: a no-op
        True
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"log_run_config: name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}"
        )
    if per not in ("job", "host"):
        raise ValueError(f"log_run_config: per must be 'job' or 'host', got {per!r}")
    running = STATE.running
    if running is None or not running.is_ours() or not capture.is_attached():
        return None
    text = canonical_json(config)
    digest = config_hash(text)
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", running.identity.host_name or "unknown")
    key = f"{name}-{digest}" if per == "job" else f"{name}-{digest}-host-{host}"
    fields: dict[str, Any] = {
        "config_name": name,
        "config_hash": digest,
        "config_bytes": len(text.encode("utf-8")),
        "config_per": per,
    }
    if _claim(running.output_dir, key):
        fields["config"] = json.loads(text)
    capture.emit_internal_instant(RUN_CONFIG, fields)
    return digest
