"""Regexes compiled on first use: a command that reads a one-line log uses few of the hundreds the parser
defines, and compiling them all took most of its start-up.

`lazy_compile` returns an object with the methods of a compiled pattern; the first call compiles it and binds
the compiled pattern's own methods in their place, so later calls cost what a compiled pattern's cost."""

from __future__ import annotations

import re
from typing import Any, AnyStr, cast

from dispatchlab.core import compiledre

_METHODS = ("search", "match", "fullmatch", "finditer", "findall", "sub", "subn", "split")


class _LazyPattern:
    def __init__(self, pattern: str | bytes, flags: int) -> None:
        self.pattern = pattern
        self._flags = flags

    def _compiled(self) -> re.Pattern[Any]:
        compiled = compiledre.compile(self.pattern, self._flags)
        for name in _METHODS:
            setattr(self, name, getattr(compiled, name))  # instance attributes shadow the methods below
        self.flags, self.groups, self.groupindex = compiled.flags, compiled.groups, compiled.groupindex
        return compiled

    def __getattr__(self, name: str) -> Any:  # flags, groups, groupindex before the first use
        if name in ("flags", "groups", "groupindex"):
            return getattr(self._compiled(), name)
        raise AttributeError(name)

    def search(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled().search(*args, **kwargs)

    def match(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled().match(*args, **kwargs)

    def fullmatch(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled().fullmatch(*args, **kwargs)

    def finditer(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled().finditer(*args, **kwargs)

    def findall(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled().findall(*args, **kwargs)

    def sub(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled().sub(*args, **kwargs)

    def subn(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled().subn(*args, **kwargs)

    def split(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled().split(*args, **kwargs)

    def __repr__(self) -> str:
        return f"lazy_compile({self.pattern!r})"


def lazy_compile(pattern: AnyStr, flags: int = 0) -> re.Pattern[AnyStr]:
    return cast("re.Pattern[AnyStr]", _LazyPattern(pattern, flags))
