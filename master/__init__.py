"""sockherd.master: the process you launch (CLI, config, listeners, spawning,
supervision, generations, reload/upgrade, drain, control server)."""
from importlib.metadata import version as _version

__version__ = _version("sockherd")
