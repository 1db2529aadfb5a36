"""Versions and specifier sets as PEP 440 defines them, through `packaging`: `0.5.6.post1`, `2.8.0+cu128`,
`0.6.11rc1`; `>=0.5.5,<0.6`, `~=0.4.1`, `==0.5.*`. `<0.6` excludes `0.6.0rc1` and `>0.5.6` excludes
`0.5.6.post1`, as the standard says. A version the log prints that is no version is an unknown fact."""

from __future__ import annotations

from packaging.specifiers import InvalidSpecifier
from packaging.specifiers import SpecifierSet as _PackagingSpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = ["InvalidSpecifier", "InvalidVersion", "SpecifierSet", "Version"]


class SpecifierSet:
    """A non-empty specifier set; `contains` says True/False, or None when the version is unreadable."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._spec = _PackagingSpecifierSet(text)
        # `===` compares strings, not versions: no range to hold a log's version against
        if not len(self._spec) or any(s.operator == "===" for s in self._spec):
            raise InvalidSpecifier(text)

    def contains(self, version: str) -> bool | None:
        try:
            have = Version(version)
        except InvalidVersion:
            return None
        # a server's release candidate is what people run: a range admits it like any other version
        return self._spec.contains(have, prereleases=True)
