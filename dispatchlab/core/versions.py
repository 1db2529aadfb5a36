"""Versions and specifier sets as PEP 440 defines them, through `packaging`: `0.5.6.post1`, `2.8.0+cu128`,
`0.6.11rc1`; `>=0.5.5,<0.6`, `~=0.4.1`, `==0.5.*`. `<0.6` excludes `0.6.0rc1` and `>0.5.6` excludes
`0.5.6.post1`, as the standard says. A version the log prints that is no version is an unknown fact.

`packaging` is imported on first use (its regexes take a few milliseconds, and most logs name no version a
signature condition reads): `Version`, `InvalidVersion` and `InvalidSpecifier` are this module's attributes
the moment something asks for them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from packaging.specifiers import InvalidSpecifier
    from packaging.version import InvalidVersion, Version

__all__ = ["InvalidSpecifier", "InvalidVersion", "SpecifierSet", "Version"]


def __getattr__(name: str) -> Any:
    if name == "InvalidSpecifier":
        from packaging.specifiers import InvalidSpecifier

        return InvalidSpecifier
    if name in ("InvalidVersion", "Version"):
        from packaging import version

        return getattr(version, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SpecifierSet:
    """A non-empty specifier set; `contains` says True/False, or None when the version is unreadable."""

    def __init__(self, text: str) -> None:
        from packaging.specifiers import InvalidSpecifier
        from packaging.specifiers import SpecifierSet as _PackagingSpecifierSet

        self.text = text
        self._spec = _PackagingSpecifierSet(text)
        # `===` compares strings, not versions: no range to hold a log's version against
        if not len(self._spec) or any(s.operator == "===" for s in self._spec):
            raise InvalidSpecifier(text)

    def contains(self, version: str) -> bool | None:
        from packaging.version import InvalidVersion, Version

        try:
            have = Version(version)
        except InvalidVersion:
            return None
        # a server's release candidate is what people run: a range admits it like any other version
        return self._spec.contains(have, prereleases=True)
