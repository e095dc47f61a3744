"""Settings a keyword gives, else an environment variable: the one rule, in one place."""
import os
from pathlib import Path


def setting(explicit, env: str) -> str | None:
    """`explicit` when it is not None, else $`env` (None when unset or empty)."""
    return explicit if explicit is not None else os.environ.get(env) or None


def path(value: str | os.PathLike) -> Path:
    """A folder or file the user named, as a Path with a leading ``~`` or ``~user`` expanded (as a shell
    would: ``cache_dir="~/.cache/loopfuse"`` is in the home folder, not a ``./~`` folder).

    Examples:
        >>> path("~/.cache/loopfuse") == Path.home() / ".cache" / "loopfuse", str(path("runs/~1"))
        (True, 'runs/~1')
    """
    return Path(value).expanduser()


def folder(explicit, env: str) -> Path | None:
    """A folder setting (see `setting`) as a Path (``~`` expanded, see `path`), or None."""
    value = setting(explicit, env)
    return path(value) if value else None


def flag(explicit: bool | None, env: str) -> bool:
    """A switch: the keyword when given, else whether $`env` is set to anything but 0."""
    value = setting(explicit, env)
    return value not in (None, "0") if not isinstance(value, bool) else value
