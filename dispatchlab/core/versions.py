"""A small PEP 440 subset (the core stays standard-library only): versions like `0.5.6.post1`,
`2.8.0+cu128`, `0.6.11rc1`, and specifier sets like `>=0.5.5,<0.6` or `~=0.4.1` or `==0.5.*`."""

from __future__ import annotations

import re
from functools import total_ordering

_VERSION = re.compile(
    r"^\s*v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre_l>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>\d*))?"
    r"(?:(?:-(?P<post_n1>\d+))|(?:[-_.]?(?:post|rev|r)[-_.]?(?P<post_n2>\d*)))?"
    r"(?:[-_.]?dev[-_.]?(?P<dev_n>\d*))?(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$",
    re.I,
)
_PRE_ORDER = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


class InvalidVersion(ValueError):
    pass


class InvalidSpecifier(ValueError):
    pass


@total_ordering
class Version:
    def __init__(self, text: str) -> None:
        m = _VERSION.match(text)
        if not m:
            raise InvalidVersion(text)
        self.text = text
        self.release = tuple(int(x) for x in m.group("release").split("."))
        pre = m.group("pre_l")
        post = m.group("post_n1") or m.group("post_n2")
        has_post = m.group("post_n1") is not None or m.group("post_n2") is not None
        dev = m.group("dev_n")
        has_dev = dev is not None
        # sort key: dev < pre < final < post
        self._key = (
            int(m.group("epoch") or 0),
            self._trim(self.release),
            (_PRE_ORDER[pre.lower()], int(m.group("pre_n") or 0))
            if pre
            else ((-1, 0) if has_dev and not has_post else (9, 0)),
            int(post or 0) if has_post else -1,
            int(dev or 0) if has_dev else 1 << 30,
        )

    @staticmethod
    def _trim(release: tuple[int, ...]) -> tuple[int, ...]:
        items = list(release)
        while len(items) > 1 and items[-1] == 0:
            items.pop()
        return tuple(items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._key == other._key

    def __lt__(self, other: Version) -> bool:
        return self._key < other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"Version({self.text!r})"


_CLAUSE = re.compile(r"^\s*(~=|===|==|!=|<=|>=|<|>)\s*(\S+)\s*$")


class SpecifierSet:
    def __init__(self, text: str) -> None:
        self.text = text
        self.clauses: list[tuple[str, str]] = []
        for part in text.split(","):
            if not part.strip():
                continue
            m = _CLAUSE.match(part)
            if not m:
                raise InvalidSpecifier(text)
            op, value = m.groups()
            probe = value[:-2] if value.endswith(".*") else value
            try:
                Version(probe)
            except InvalidVersion:
                raise InvalidSpecifier(text) from None
            if value.endswith(".*") and op not in ("==", "!="):
                raise InvalidSpecifier(text)
            self.clauses.append((op, value))
        if not self.clauses:
            raise InvalidSpecifier(text)

    def contains(self, version: str) -> bool | None:
        """True/False, or None when `version` is not a version (the fact is unknown)."""
        try:
            have = Version(version)
        except InvalidVersion:
            return None
        return all(self._holds(have, op, value) for op, value in self.clauses)

    @staticmethod
    def _holds(have: Version, op: str, value: str) -> bool:
        if value.endswith(".*"):
            prefix = Version(value[:-2]).release
            same = have.release[: len(prefix)] == prefix
            return same if op == "==" else not same
        want = Version(value)
        if op in ("==", "==="):
            return have == want
        if op == "!=":
            return have != want
        if op == "<":
            return have < want
        if op == "<=":
            return have <= want
        if op == ">":
            return have > want
        if op == ">=":
            return have >= want
        # ~=X.Y.Z : >= X.Y.Z and == X.Y.*
        prefix = want.release[:-1] if len(want.release) > 1 else want.release
        return have >= want and have.release[: len(prefix)] == prefix
