"""Settings a keyword gives, else an environment variable: the one rule, in one place."""
import os
from pathlib import Path


def setting(explicit, env: str) -> str | None:
    """`explicit` when it is not None, else $`env` (None when unset or empty)."""
    return explicit if explicit is not None else os.environ.get(env) or None


def folder(explicit, env: str) -> Path | None:
    """A folder setting (see `setting`) as a Path, or None."""
    value = setting(explicit, env)
    return Path(value) if value else None


def flag(explicit: bool | None, env: str) -> bool:
    """A switch: the keyword when given, else whether $`env` is set to anything but 0."""
    value = setting(explicit, env)
    return value not in (None, "0") if not isinstance(value, bool) else value
