"""Optional-dependency loading: a missing extra is an ImportError that names how to install it."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ImportError):
    """An optional integration was used without its extra installed."""


def require(module: str, extra: str, *, feature: str | None = None) -> ModuleType:
    """Import ``module`` or raise ImportError naming ``pip install 'remem-agent[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        what = feature or module
        raise MissingExtraError(
            f"{what} needs the optional dependency {module!r}; install it with pip install 'remem-agent[{extra}]'"
        ) from exc
