#!/usr/bin/env python3
"""Build the launch-flag catalog of SGLang (and vLLM) from their source, without importing them.

Regenerate the shipped catalogs with::

    for v in 0.4.6.post5 0.4.10 0.5.1 0.5.3 0.5.6 0.5.10.post1 0.5.15.post1 0.5.20 0.5.23; do
        pip download --no-deps -d WHEELS sglang==$v; done
    python tools/gen_flag_catalog.py --out dispatchlab/core/data/flags-sglang.json WHEELS/sglang-*.whl
    for v in 0.6.6.post1 0.10.2 0.33.0; do pip download --no-deps -d WHEELS vllm==$v; done
    python tools/gen_flag_catalog.py --server vllm --out dispatchlab/core/data/flags-vllm.json \\
        WHEELS/vllm-*.whl

(each catalog's exact command is its ``"generated_by"`` field, with ``"wheels_from"`` next to it).

Each positional argument is a wheel (``.whl``), an installed package directory
(``.../site-packages/sglang``) or a directory that contains the package
(``.../site-packages``). Only the standard library is used: sources are read with
``zipfile``/``pathlib`` and analysed with ``ast``; nothing of sglang or vLLM is imported.

What is understood (SGLang):

* explicit ``parser.add_argument("--flag", "--alias", dest=..., type=..., choices=...,
  default=..., action=..., nargs=..., help=...)`` calls anywhere in ``server_args.py``
  (``ServerArgs.add_cli_args`` in every release so far);
* declarative fields (sglang >= 0.5.15): ``name: A[T, "help"] = default`` or
  ``name: A[T, Arg(help=..., choices=..., aliases=..., cli_name=..., action=...,
  nargs=..., type_parser=..., no_cli=...)] = default`` on the ``ServerArgs`` class and,
  from 0.5.20 on, on the namespace classes passed to ``collect_input_fields(...)``. The flag
  is derived as SGLang's own ``add_cli_args_from_dataclass`` derives it: ``--`` plus the
  field name with ``_`` -> ``-`` unless ``cli_name`` is given; ``Literal[...]`` gives choices,
  ``bool`` gives ``store_true``, ``List[X]`` gives ``nargs="+"``.

Values (``choices``, ``default``) are evaluated by a small constant evaluator that follows
module-level assignments, ``from X import NAME`` across the package, list/tuple/set/dict
displays, ``+``/``|``, ``list()``/``sorted()``/``set()``, ``.keys()``, comprehensions and
enum members. What it cannot evaluate is recorded as ``null`` with
``"choices_unresolved": true`` (or ``"default_unresolved": "<source text>"``).

vLLM (best effort): ``group.add_argument("--flag", "-alias", **model_kwargs["field"])`` calls
in ``vllm/engine/arg_utils.py`` where ``model_kwargs = get_kwargs(SomeConfig)``: the entry is
derived from ``SomeConfig.field`` as ``get_kwargs`` derives it (a ``Literal`` gives sorted
choices, ``bool`` gives ``BooleanOptionalAction``, ``list[...]`` gives ``nargs="+"``), then the
call's own keywords override it; plus every field of ``FrontendArgs`` (the ``vllm serve``
flags, added in a loop). Where argparse gets no choices but the type names the valid values
(``QuantizationMethods | str``, an enum such as ``AttentionBackendEnum``) the values are
recorded with ``"choices_open": true``.

Each flag entry: ``dest``, ``choices`` (list or null), ``default``, ``type`` (source text of
the argparse type, or null), ``action`` (``store_true``, a class name, or null), ``nargs``,
``aliases``, and when they apply ``required``, ``const``, ``deprecated`` (+
``deprecated_hint``), ``choices_unresolved``, ``default_unresolved`` (source text),
``choices_open``, ``from_config`` (vLLM). ``"aliases"`` at the top level maps each alias to its
primary flag per version.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------
# Source access
# --------------------------------------------------------------------------------------


class Source:
    """Read ``pkg/sub/mod.py`` style paths out of a wheel or a directory tree."""

    def __init__(self, location: str, package: str):
        self.location = location
        self.package = package
        p = Path(location)
        self._zip: zipfile.ZipFile | None = None
        self._root: Path | None = None
        if p.is_file() and zipfile.is_zipfile(p):
            self._zip = zipfile.ZipFile(p)
            self._names = set(self._zip.namelist())
        elif p.is_dir():
            if (p / package).is_dir():
                self._root = p
            elif p.name == package:
                self._root = p.parent
            else:
                raise SystemExit(f"{location}: no {package}/ directory here")
        else:
            raise SystemExit(f"{location}: not a wheel or a directory")

    def read(self, relpath: str) -> str | None:
        if self._zip is not None:
            if relpath not in self._names:
                return None
            return self._zip.read(relpath).decode("utf-8", "replace")
        assert self._root is not None
        f = self._root / relpath
        return f.read_text("utf-8", "replace") if f.is_file() else None

    def version(self) -> str:
        name = Path(self.location).name
        m = re.match(rf"{self.package}-([^-]+)-", name)
        if self._zip is not None and m:
            return m.group(1)
        if self._zip is not None:
            for n in self._names:
                if n.endswith(".dist-info/METADATA"):
                    for line in self._zip.read(n).decode().splitlines():
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
        for rel in (f"{self.package}/version.py", f"{self.package}/_version.py"):
            text = self.read(rel)
            if text:
                m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
                if m:
                    return m.group(1)
        if self._root is not None:
            for d in self._root.glob(f"{self.package}-*.dist-info"):
                return d.name[len(self.package) + 1 : -len(".dist-info")]
        return "unknown"


# --------------------------------------------------------------------------------------
# A small constant evaluator
# --------------------------------------------------------------------------------------


class _Opaque:
    """A value the evaluator cannot know."""

    _inst: _Opaque | None = None

    def __new__(cls):
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self) -> str:
        return "OPAQUE"


OPAQUE = _Opaque()


class ClassRef:
    def __init__(self, module: Module, node: ast.ClassDef):
        self.module = module
        self.node = node
        self.name = node.name
        self._scope: dict | None = None

    def __repr__(self) -> str:
        return f"<class {self.module.name}.{self.name}>"

    def base_names(self) -> list[str]:
        return [ast.unparse(b) for b in self.node.bases]

    def is_enum(self) -> bool:
        return any("Enum" in b for b in self.base_names())

    def body_value(self, name: str) -> Any:
        """Value of a class attribute: a class-level assignment or a field default."""
        scope = self.class_scope()
        if name in scope:
            return scope[name]
        for base in self.node.bases:
            b = self.module.eval(base)
            if isinstance(b, ClassRef):
                v = b.body_value(name)
                if v is not OPAQUE:
                    return v
        return OPAQUE

    def class_scope(self) -> dict:
        """Class-level names, evaluated in order (later ones may use earlier ones)."""
        if self._scope is None:
            self._scope = {}
            for stmt in self.node.body:
                if isinstance(stmt, ast.Assign):
                    v = self.module.eval(stmt.value, self._scope)
                    for t in stmt.targets:
                        if isinstance(t, ast.Name):
                            self._scope[t.id] = v
                elif (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and stmt.value is not None
                ):
                    v = field_default(self.module, stmt.value, self._scope)
                    self._scope[stmt.target.id] = v
        return self._scope

    def members(self) -> list[EnumMember]:
        out = []
        for stmt in self.node.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                t = stmt.targets[0]
                if isinstance(t, ast.Name) and not t.id.startswith("_"):
                    val = self.module.eval(stmt.value)
                    if isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func).endswith("auto"):
                        val = len(out) + 1
                    out.append(EnumMember(t.id, val))
            elif (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.value is not None
                and not stmt.target.id.startswith("_")
            ):
                out.append(EnumMember(stmt.target.id, self.module.eval(stmt.value)))
        return out


class EnumMember:
    def __init__(self, name: str, value: Any):
        self.name = name
        self.value = value


class FuncRef:
    def __init__(self, module: Module, node: ast.AST):
        self.module = module
        self.node = node


class ModuleRef:
    def __init__(self, loader: Loader, name: str):
        self.loader = loader
        self.name = name


class _External:
    """A standard-library module whose few constants we know (``argparse.SUPPRESS``)."""

    def __init__(self, name: str):
        self.name = name


_EXTERNAL_CONSTANTS = {
    "argparse.SUPPRESS": "==SUPPRESS==",
    "sys.maxsize": sys.maxsize,
    "math.inf": float("inf"),
}
_EXTERNAL_MODULES = {"argparse", "sys", "math"}


class _LazyImport:
    def __init__(self, module: str, attr: str | None):
        self.module = module
        self.attr = attr


_SAFE_STR_METHODS = {
    "lower",
    "upper",
    "replace",
    "strip",
    "startswith",
    "endswith",
    "split",
    "format",
    "join",
}


def is_concrete(v: Any) -> bool:
    if v is OPAQUE or isinstance(v, (ClassRef, FuncRef, ModuleRef, EnumMember, _LazyImport)):
        return False
    if isinstance(v, (list, tuple, set, frozenset)):
        return all(is_concrete(x) for x in v)
    if isinstance(v, dict):
        return all(is_concrete(k) and is_concrete(x) for k, x in v.items())
    return v is None or isinstance(v, (str, int, float, bool))


def to_json(v: Any) -> Any:
    if isinstance(v, (set, frozenset)):
        return sorted((to_json(x) for x in v), key=lambda x: (str(type(x)), str(x)))
    if isinstance(v, (list, tuple)):
        return [to_json(x) for x in v]
    if isinstance(v, dict):
        return {str(k): to_json(x) for k, x in v.items()}
    if isinstance(v, float) and v != v:  # NaN
        return None
    return v


class Module:
    def __init__(self, loader: Loader, name: str, tree: ast.Module, is_pkg: bool):
        self.loader = loader
        self.name = name
        self.tree = tree
        self.is_pkg = is_pkg
        self.env: dict[str, Any] = {}
        self.star_imports: list[str] = []
        self._resolved: dict[str, Any] = {}
        self._built = False

    # module-level environment, evaluated in statement order
    def build(self) -> None:
        if self._built:
            return
        self._built = True
        self._exec_body(self.tree.body)

    def _exec_body(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            try:
                self._exec(stmt)
            except RecursionError:
                raise
            except Exception:
                for t in getattr(stmt, "targets", []):
                    if isinstance(t, ast.Name):
                        self.env[t.id] = OPAQUE

    def _exec(self, stmt: ast.stmt) -> None:
        env = self.env
        if isinstance(stmt, ast.ImportFrom):
            base = self.resolve_relative(stmt.module, stmt.level)
            for alias in stmt.names:
                if alias.name == "*":
                    self.star_imports.append(base)
                    continue
                env[alias.asname or alias.name] = _LazyImport(base, alias.name)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    env[alias.asname] = _LazyImport(alias.name, None)
                else:
                    top = alias.name.split(".")[0]
                    env[top] = _LazyImport(top, None)
        elif isinstance(stmt, ast.ClassDef):
            env[stmt.name] = ClassRef(self, stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            env[stmt.name] = FuncRef(self, stmt)
        elif isinstance(stmt, ast.Assign):
            val = self.eval(stmt.value)
            for t in stmt.targets:
                if isinstance(t, ast.Name):
                    env[t.id] = val
                    self.loader.assign_nodes.setdefault((self.name, t.id), stmt.value)
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if stmt.value is not None:
                env[stmt.target.id] = self.eval(stmt.value)
                self.loader.assign_nodes.setdefault((self.name, stmt.target.id), stmt.value)
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            cur = env.get(stmt.target.id, OPAQUE)
            env[stmt.target.id] = self._binop(stmt.op, cur, self.eval(stmt.value))
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            f = call.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                target = env.get(f.value.id)
                args = [self.eval(a) for a in call.args]
                if isinstance(target, list) and f.attr in ("extend", "append"):
                    if f.attr == "extend" and args and isinstance(args[0], (list, tuple, set)):
                        target.extend(args[0])
                    elif f.attr == "append" and args:
                        target.append(args[0])
                    else:
                        env[f.value.id] = OPAQUE
                elif isinstance(target, set) and f.attr in ("add", "update") and args:
                    if f.attr == "add":
                        target.add(args[0])
                    elif isinstance(args[0], (list, tuple, set)):
                        target.update(args[0])
                elif isinstance(target, dict) and f.attr == "update" and args and isinstance(args[0], dict):
                    target.update(args[0])
        elif isinstance(stmt, ast.If):
            # `if TYPE_CHECKING:` gives the typed names (its `else:` only runtime stand-ins
            # such as `QuantizationMethods = str`); other switches: take both branches.
            self._exec_body(stmt.body)
            if ast.unparse(stmt.test).split(".")[-1] != "TYPE_CHECKING":
                self._exec_body(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            self._exec_body(stmt.body)

    def resolve_relative(self, module: str | None, level: int) -> str:
        if not level:
            return module or ""
        parts = self.name.split(".")
        if not self.is_pkg:
            parts = parts[:-1]
        if level > 1:
            parts = parts[: len(parts) - (level - 1)]
        return ".".join(parts + ([module] if module else []))

    def lookup(self, name: str, scope: dict | None = None) -> Any:
        if scope and name in scope:
            v = scope[name]
            if isinstance(v, _LazyImport):
                v = self.loader.import_value(v.module, v.attr)
            return v
        self.build()
        if name in self.env:
            v = self.env[name]
            if isinstance(v, _LazyImport):
                if name not in self._resolved:
                    self._resolved[name] = self.loader.import_value(v.module, v.attr)
                v = self._resolved[name]
            return v
        for star in self.star_imports:
            other = self.loader.module(star)
            if other is not None and not name.startswith("_"):
                v = self.loader.import_value(star, name)
                if v is not OPAQUE:
                    return v
        if name in _BUILTINS:
            return _BUILTINS[name]
        return OPAQUE

    # expression evaluation --------------------------------------------------------
    def eval(self, node: ast.AST | None, scope: dict | None = None) -> Any:
        if node is None:
            return None
        try:
            return self._eval(node, scope or {})
        except RecursionError:
            return OPAQUE
        except Exception:
            return OPAQUE

    def _eval(self, node: ast.AST, scope: dict) -> Any:
        ev = self._eval
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            out: list = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    v = ev(elt.value, scope)
                    if not isinstance(v, (list, tuple, set, frozenset, dict)):
                        return OPAQUE
                    out.extend(v)
                else:
                    out.append(ev(elt, scope))
            if isinstance(node, ast.Tuple):
                return tuple(out)
            if isinstance(node, ast.Set):
                return set(out) if all(is_concrete(x) for x in out) else OPAQUE
            return out
        if isinstance(node, ast.Dict):
            d: dict = {}
            for k, v in zip(node.keys, node.values, strict=False):
                if k is None:
                    sub = ev(v, scope)
                    if not isinstance(sub, dict):
                        return OPAQUE
                    d.update(sub)
                    continue
                kk = ev(k, scope)
                if not is_concrete(kk):
                    return OPAQUE
                d[kk] = ev(v, scope)
            return d
        if isinstance(node, ast.Name):
            return self.lookup(node.id, scope)
        if isinstance(node, ast.Attribute):
            base = ev(node.value, scope)
            return self._attr(base, node.attr)
        if isinstance(node, ast.BinOp):
            return self._binop(node.op, ev(node.left, scope), ev(node.right, scope))
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand, scope)
            if isinstance(node.op, ast.Not):
                return OPAQUE if v is OPAQUE else not v
            if isinstance(node.op, ast.USub) and isinstance(v, (int, float)):
                return -v
            return OPAQUE
        if isinstance(node, ast.BoolOp):
            vals = [ev(v, scope) for v in node.values]
            if any(v is OPAQUE for v in vals):
                return OPAQUE
            if isinstance(node.op, ast.And):
                return all(vals)
            return any(vals)
        if isinstance(node, ast.Compare):
            left = ev(node.left, scope)
            for op, comp in zip(node.ops, node.comparators, strict=False):
                right = ev(comp, scope)
                if left is OPAQUE or right is OPAQUE:
                    return OPAQUE
                ok = {
                    ast.Eq: lambda a, b: a == b,
                    ast.NotEq: lambda a, b: a != b,
                    ast.In: lambda a, b: a in b,
                    ast.NotIn: lambda a, b: a not in b,
                    ast.Is: lambda a, b: a is b,
                    ast.IsNot: lambda a, b: a is not b,
                }.get(type(op))
                if ok is None or not ok(left, right):
                    return False if ok else OPAQUE
                left = right
            return True
        if isinstance(node, ast.IfExp):
            t = ev(node.test, scope)
            if t is OPAQUE:
                return OPAQUE
            return ev(node.body if t else node.orelse, scope)
        if isinstance(node, ast.Subscript):
            base = ev(node.value, scope)
            idx = ev(node.slice, scope)
            if isinstance(base, (list, tuple, dict, str)) and is_concrete(idx):
                return base[idx]
            return OPAQUE
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            items = self._comp(node.generators, node.elt, scope)
            if items is OPAQUE:
                return OPAQUE
            if isinstance(node, ast.SetComp):
                return set(items) if all(is_concrete(x) for x in items) else OPAQUE
            return items
        if isinstance(node, ast.DictComp):
            pairs = self._comp(node.generators, ast.Tuple([node.key, node.value]), scope)
            if pairs is OPAQUE:
                return OPAQUE
            return dict(pairs)
        if isinstance(node, ast.Call):
            return self._call(node, scope)
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    parts.append(str(v.value))
                elif isinstance(v, ast.FormattedValue):
                    x = ev(v.value, scope)
                    if not is_concrete(x):
                        return OPAQUE
                    parts.append(str(x))
            return "".join(parts)
        if isinstance(node, ast.Lambda):
            return FuncRef(self, node)
        return OPAQUE

    def _comp(self, gens: list[ast.comprehension], elt: ast.AST, scope: dict) -> Any:
        results: list = []

        def rec(i: int, sc: dict) -> bool:
            if i == len(gens):
                results.append(self._eval(elt, sc))
                return True
            g = gens[i]
            it = self._iterable(self._eval(g.iter, sc))
            if it is OPAQUE:
                return False
            for item in it:
                sc2 = dict(sc)
                if not self._bind(g.target, item, sc2):
                    return False
                conds = [self._eval(c, sc2) for c in g.ifs]
                if any(c is OPAQUE for c in conds):
                    return False
                if all(conds) and not rec(i + 1, sc2):
                    return False
            return True

        return results if rec(0, dict(scope)) else OPAQUE

    def _bind(self, target: ast.AST, item: Any, sc: dict) -> bool:
        if isinstance(target, ast.Name):
            sc[target.id] = item
            return True
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(item, (tuple, list)):
            if len(target.elts) != len(item):
                return False
            return all(self._bind(t, x, sc) for t, x in zip(target.elts, item, strict=False))
        return False

    def _iterable(self, v: Any) -> Any:
        if isinstance(v, dict):
            return list(v.keys())
        if isinstance(v, (list, tuple)):
            return list(v)
        if isinstance(v, (set, frozenset)):
            return sorted(v, key=str)
        if isinstance(v, ClassRef) and v.is_enum():
            return v.members()
        return OPAQUE

    def _attr(self, base: Any, attr: str) -> Any:
        if isinstance(base, ClassRef):
            if base.is_enum():
                for m in base.members():
                    if m.name == attr:
                        return m
            return base.body_value(attr)
        if isinstance(base, EnumMember):
            if attr == "value":
                return base.value
            if attr == "name":
                return base.name
            return OPAQUE
        if isinstance(base, ModuleRef):
            return self.loader.import_value(base.name, attr)
        if isinstance(base, _External):
            return _EXTERNAL_CONSTANTS.get(f"{base.name}.{attr}", OPAQUE)
        if isinstance(base, (dict, list, str, set, frozenset)):
            return _BoundMethod(base, attr)
        return OPAQUE

    def _binop(self, op: ast.operator, a: Any, b: Any) -> Any:
        if a is OPAQUE or b is OPAQUE:
            return OPAQUE
        if isinstance(op, ast.Add):
            if isinstance(a, list) and isinstance(b, (list, tuple)):
                return a + list(b)
            if isinstance(a, tuple) and isinstance(b, tuple):
                return a + b
            if isinstance(a, (str, int, float)) and type(a) is type(b):
                return a + b
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                return a + b
            return OPAQUE
        if isinstance(op, ast.BitOr):
            if isinstance(a, (set, frozenset)) and isinstance(b, (set, frozenset)):
                return set(a) | set(b)
            if isinstance(a, dict) and isinstance(b, dict):
                return {**a, **b}
            return OPAQUE
        if isinstance(op, ast.Sub) and isinstance(a, (set, frozenset)):
            return set(a) - set(b)
        if isinstance(op, ast.Mult) and isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return a * b
        if isinstance(op, ast.Mult) and isinstance(a, list) and isinstance(b, int):
            return a * b
        if isinstance(op, ast.Pow) and isinstance(a, int) and isinstance(b, int):
            return a**b
        return OPAQUE

    def _call(self, node: ast.Call, scope: dict) -> Any:
        fname = ast.unparse(node.func).split(".")[-1]
        if fname == "get_args" and len(node.args) == 1:
            # typing.get_args(SomeLiteralAlias)
            lit = analyse_type(self, node.args[0])["literal"]
            return tuple(lit) if lit is not None else OPAQUE
        f = self._eval(node.func, scope)
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                v = self._eval(a.value, scope)
                if not isinstance(v, (list, tuple)):
                    return OPAQUE
                args.extend(v)
            else:
                args.append(self._eval(a, scope))
        kwargs = {k.arg: self._eval(k.value, scope) for k in node.keywords if k.arg}
        if isinstance(f, _BoundMethod):
            return f.call(args, kwargs)
        if isinstance(f, _Builtin):
            return f.call(self, args, kwargs)
        if isinstance(f, FuncRef) and isinstance(f.node, ast.Lambda) and not f.node.args.args:
            return f.module.eval(f.node.body)
        if (
            isinstance(f, FuncRef)
            and isinstance(f.node, ast.FunctionDef)
            and not (args or kwargs or f.node.args.args)
        ):
            return f.module.eval_helper(f.node)
        return OPAQUE

    def eval_helper(self, fn: ast.FunctionDef) -> Any:
        """A zero-argument helper: its local imports and assignments, then its last return."""
        scope: dict = {}
        ret: ast.AST | None = None
        for stmt in fn.body:
            if isinstance(stmt, ast.ImportFrom):
                base = self.resolve_relative(stmt.module, stmt.level)
                for alias in stmt.names:
                    scope[alias.asname or alias.name] = _LazyImport(base, alias.name)
            elif isinstance(stmt, ast.Assign):
                v = self.eval(stmt.value, scope)
                for t in stmt.targets:
                    if isinstance(t, ast.Name):
                        scope[t.id] = v
            elif isinstance(stmt, ast.Return):
                ret = stmt.value
        return self.eval(ret, scope) if ret is not None else OPAQUE


class _BoundMethod:
    def __init__(self, obj: Any, name: str):
        self.obj = obj
        self.name = name

    def call(self, args: list, kwargs: dict) -> Any:
        o, n = self.obj, self.name
        if any(not is_concrete(a) for a in args) and not (n in ("get",) and isinstance(o, dict)):
            return OPAQUE
        if isinstance(o, dict):
            if n == "keys":
                return list(o.keys())
            if n == "values":
                return list(o.values())
            if n == "items":
                return list(o.items())
            if n == "get":
                return o.get(*args)
            if n == "copy":
                return dict(o)
        if isinstance(o, (set, frozenset)) and n in ("union", "difference"):
            return set(getattr(set(o), n)(*[set(a) for a in args]))
        if isinstance(o, list) and n == "copy":
            return list(o)
        if isinstance(o, str) and n in _SAFE_STR_METHODS:
            return getattr(o, n)(*args, **kwargs)
        return OPAQUE


class _Builtin:
    def __init__(self, name: str):
        self.name = name

    def call(self, mod: Module, args: list, kwargs: dict) -> Any:
        n = self.name
        if n in ("str", "int", "float", "bool") and not args:
            return {"str": "", "int": 0, "float": 0.0, "bool": False}[n]
        if n in ("list", "tuple", "set", "frozenset", "sorted", "dict"):
            if not args:
                return {"list": [], "tuple": (), "set": set(), "frozenset": set()}.get(n, {})
            it = args[0]
            if n == "dict" and isinstance(it, dict):
                return dict(it)
            items = mod._iterable(it)
            if items is OPAQUE:
                return OPAQUE
            if n == "list":
                return list(items)
            if n == "tuple":
                return tuple(items)
            if n in ("set", "frozenset"):
                return set(items) if all(is_concrete(x) for x in items) else OPAQUE
            if n == "sorted":
                if not all(is_concrete(x) for x in items) or kwargs.get("key") is not None:
                    return OPAQUE
                return sorted(items, reverse=bool(kwargs.get("reverse")))
        if n == "len" and args and isinstance(args[0], (list, tuple, dict, set, str)):
            return len(args[0])
        if n == "range" and args and all(isinstance(a, int) for a in args):
            return list(range(*args))
        return OPAQUE


_BUILTINS: dict[str, Any] = {
    n: _Builtin(n)
    for n in (
        "list",
        "tuple",
        "set",
        "frozenset",
        "sorted",
        "dict",
        "len",
        "range",
        "str",
        "int",
        "float",
        "bool",
    )
}
_BUILTINS.update({"True": True, "False": False, "None": None})


class Loader:
    """Parses modules of one package on demand."""

    def __init__(self, source: Source):
        self.source = source
        self.modules: dict[str, Module | None] = {}
        self.assign_nodes: dict[tuple[str, str], ast.AST] = {}
        self._importing: set[tuple[str, str | None]] = set()

    def module(self, name: str) -> Module | None:
        if name in self.modules:
            return self.modules[name]
        self.modules[name] = None
        if not name.startswith(self.source.package):
            return None
        rel = name.replace(".", "/")
        for path, is_pkg in ((rel + ".py", False), (rel + "/__init__.py", True)):
            text = self.source.read(path)
            if text is not None:
                try:
                    tree = ast.parse(text)
                except SyntaxError:
                    return None
                mod = Module(self, name, tree, is_pkg)
                self.modules[name] = mod
                return mod
        return None

    def import_value(self, module: str, attr: str | None) -> Any:
        key = (module, attr)
        if key in self._importing:
            return OPAQUE
        self._importing.add(key)
        try:
            if attr is None:
                if module in _EXTERNAL_MODULES:
                    return _External(module)
                return ModuleRef(self, module) if self.module(module) else OPAQUE
            if f"{module}.{attr}" in _EXTERNAL_CONSTANTS:
                return _EXTERNAL_CONSTANTS[f"{module}.{attr}"]
            sub = self.module(f"{module}.{attr}")
            if sub is not None:
                return ModuleRef(self, sub.name)
            mod = self.module(module)
            if mod is None:
                return OPAQUE
            return mod.lookup(attr)
        finally:
            self._importing.discard(key)

    def defining_node(self, mod: Module, name: str) -> tuple[Module, ast.AST] | None:
        """The expression assigned to ``name`` (following imports), for type aliases."""
        mod.build()
        for _ in range(10):
            raw = mod.env.get(name)
            if isinstance(raw, _LazyImport) and raw.attr:
                nxt = self.module(raw.module)
                if nxt is None:
                    return None
                nxt.build()
                mod, name = nxt, raw.attr
                continue
            node = self.assign_nodes.get((mod.name, name))
            return (mod, node) if node is not None else None
        return None


def field_default(mod: Module, value: ast.AST, scope: dict | None = None) -> Any:
    """Evaluate a dataclass/msgspec field default, understanding ``field(...)``."""
    if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in ("field", "Field"):
        kw = {k.arg: k.value for k in value.keywords}
        if "default" in kw:
            return mod.eval(kw["default"], scope)
        if "default_factory" in kw:
            fac = kw["default_factory"]
            if isinstance(fac, ast.Name) and fac.id in ("list", "dict", "set", "tuple"):
                return {"list": [], "dict": {}, "set": [], "tuple": []}[fac.id]
            if isinstance(fac, ast.Lambda):
                return mod.eval(fac.body, scope)
            return OPAQUE
        return OPAQUE
    return mod.eval(value, scope)


# --------------------------------------------------------------------------------------
# Flag extraction
# --------------------------------------------------------------------------------------

_DEPRECATED_RE = re.compile(r"\bdeprecat", re.I)


def _short(node: ast.AST | None) -> str | None:
    if node is None:
        return None
    text = ast.unparse(node)
    return text if len(text) <= 120 else text[:117] + "..."


def _type_name(node: ast.AST | None) -> str | None:
    if node is None:
        return None
    return _short(node)


def _value_entry(mod: Module, node: ast.AST | None, scope: dict, key: str, out: dict) -> None:
    """Put an evaluated value under ``key``; mark it unresolved when it is not constant."""
    if node is None:
        out[key] = None
        return
    v = mod.eval(node, scope)
    if is_concrete(v):
        out[key] = to_json(v)
    else:
        out[key] = None
        out[f"{key}_unresolved"] = True if key == "choices" else _short(node)


def _local_scope_at(mod: Module, func: ast.AST, lineno: int) -> dict:
    """Values of simple local assignments made in ``func`` before ``lineno``."""
    assigns: list[tuple[int, str, ast.AST]] = []
    for n in ast.walk(func):
        if isinstance(n, ast.Assign) and n.lineno < lineno:
            for t in n.targets:
                if isinstance(t, ast.Name):
                    assigns.append((n.lineno, t.id, n.value))
    assigns.sort(key=lambda x: x[0])
    scope: dict = {}
    for _, name, value in assigns:
        scope[name] = mod.eval(value, scope)
    return scope


class Catalog:
    def __init__(self) -> None:
        self.flags: dict[str, dict] = {}
        self.aliases: dict[str, str] = {}
        self.negation = "no"

    def add(self, names: list[str], entry: dict, override: bool = True) -> None:
        if entry.get("action") and entry["action"].endswith("BooleanOptionalAction"):
            # argparse adds "--no-X" right after each "--X"
            expanded: list[str] = []
            for n in names:
                expanded.append(n)
                if self.negation == "enable_disable" and n.startswith("--enable-"):
                    expanded.append("--disable-" + n[len("--enable-") :])
                elif self.negation == "enable_disable" and n.startswith("--disable-"):
                    expanded.append("--enable-" + n[len("--disable-") :])
                elif n.startswith("--") and not n.startswith("--no-"):
                    expanded.append("--no-" + n[2:])
            names = expanded
        primary = names[0]
        entry["aliases"] = names[1:]
        if primary in self.flags and not override:
            return
        self.flags[primary] = entry
        for a in names[1:]:
            self.aliases[a] = primary


def _deprecated(entry: dict, help_text: Any, action_text: str | None) -> None:
    dep = False
    if isinstance(help_text, str) and _DEPRECATED_RE.search(help_text):
        dep = True
    if action_text and "deprecat" in action_text.lower():
        dep = True
    if dep:
        entry["deprecated"] = True
        if isinstance(help_text, str):
            entry["deprecated_hint"] = help_text.strip()[:200]


def extract_add_argument_calls(
    mod: Module,
    catalog: Catalog,
    field_defaults: dict[str, Any],
    scope_node: ast.AST | None = None,
    attr_names: tuple[str, ...] = ("add_argument",),
) -> int:
    """Record every ``X.add_argument("--flag", ...)`` call under ``scope_node``."""
    count = 0
    root = scope_node or mod.tree
    funcs: list[tuple[ast.AST, ast.Call]] = []

    def visit(node: ast.AST, func: ast.AST | None) -> None:
        for ch in ast.iter_child_nodes(node):
            nf = ch if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(ch, ast.Call) and isinstance(ch.func, ast.Attribute) and ch.func.attr in attr_names:
                funcs.append((func, ch))
            visit(ch, nf)

    visit(root, None)
    for func, call in funcs:
        names = []
        for a in call.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                names.append(a.value)
        if not names or not names[0].startswith("-"):
            continue
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        scope = _local_scope_at(mod, func, call.lineno) if func is not None else {}
        long_names = [n for n in names if n.startswith("--")] or names
        dest_node = kw.get("dest")
        dest = mod.eval(dest_node, scope) if dest_node is not None else None
        if not isinstance(dest, str):
            dest = long_names[0].lstrip("-").replace("-", "_")
        entry: dict[str, Any] = {"dest": dest}
        _value_entry(mod, kw.get("choices"), scope, "choices", entry)
        dnode = kw.get("default")
        if dnode is not None:
            v = _default_from_node(mod, dnode, scope, field_defaults)
            if v is OPAQUE:
                entry["default"] = None
                entry["default_unresolved"] = _short(dnode)
            else:
                entry["default"] = to_json(v)
        else:
            entry["default"] = field_defaults.get(dest) if dest in field_defaults else None
            if entry["default"] is OPAQUE:
                entry["default"] = None
        action_node = kw.get("action")
        action = mod.eval(action_node, scope) if action_node is not None else None
        action_text = action if isinstance(action, str) else _short(action_node)
        entry["action"] = action_text
        entry["type"] = _type_name(kw.get("type"))
        nargs = mod.eval(kw["nargs"], scope) if "nargs" in kw else None
        entry["nargs"] = nargs if is_concrete(nargs) else _short(kw.get("nargs"))
        if "const" in kw:
            c = mod.eval(kw["const"], scope)
            entry["const"] = to_json(c) if is_concrete(c) else _short(kw["const"])
        if "required" in kw and mod.eval(kw["required"], scope) is True:
            entry["required"] = True
        if entry["default"] is None and "default_unresolved" not in entry:
            if action_text in ("store_true",) and dnode is None:
                entry["default"] = False
            elif action_text == "store_false" and dnode is None:
                entry["default"] = True
        help_v = mod.eval(kw.get("help"), scope) if "help" in kw else None
        _deprecated(entry, help_v, action_text)
        catalog.add(long_names + [n for n in names if n not in long_names], entry)
        count += 1
    return count


def _default_from_node(mod: Module, node: ast.AST, scope: dict, field_defaults: dict) -> Any:
    # default=ServerArgs.x
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("ServerArgs", "EngineArgs", "AsyncEngineArgs")
        and node.attr in field_defaults
    ):
        return field_defaults[node.attr]
    # default=_declared_default("x") and similar helpers
    if (
        isinstance(node, ast.Call)
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
        and "default" in ast.unparse(node.func).lower()
        and node.args[0].value in field_defaults
    ):
        return field_defaults[node.args[0].value]
    v = mod.eval(node, scope)
    return v if is_concrete(v) else OPAQUE


# -- declarative (A[T, Arg(...)]) fields ------------------------------------------------


def _subscript_parts(node: ast.AST) -> tuple[str, list[ast.AST]] | None:
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value).split(".")[-1]
        sl = node.slice
        parts = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
        return head, parts
    return None


def _resolve_alias(mod: Module, node: ast.AST) -> tuple[Module, ast.AST]:
    """Follow ``Name`` type aliases (``MoeBackend = Literal[...]``) to their definition."""
    for _ in range(5):
        if isinstance(node, ast.Name) and node.id not in ("str", "int", "float", "bool"):
            found = mod.loader.defining_node(mod, node.id)
            if found is None:
                break
            mod, node = found
            # `X: TypeAlias = ...` and `type X = ...` both end here
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
                continue
            except SyntaxError:
                break
        break
    return mod, node


def analyse_type(mod: Module, node: ast.AST) -> dict:
    """Break a type annotation into optional / literal choices / list element / base name."""
    info: dict[str, Any] = {
        "optional": False,
        "literal": None,
        "list_elem": None,
        "base": None,
        "mod": mod,
    }
    mod, node = _resolve_alias(mod, node)
    # X | None
    while True:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            members = _flatten_union(node)
            non_none = [m for m in members if not _is_none(m)]
            if len(non_none) != len(members):
                info["optional"] = True
            if len(non_none) == 1:
                mod, node = _resolve_alias(mod, non_none[0])
                continue
            lits = _union_literals(mod, non_none)
            if lits is not None:
                info["literal"] = lits
                return info
            info["base"] = ast.unparse(node)
            return info
        sp = _subscript_parts(node)
        if sp and sp[0] == "Optional":
            info["optional"] = True
            mod, node = _resolve_alias(mod, sp[1][0])
            continue
        if sp and sp[0] == "Union":
            non_none = [m for m in sp[1] if not _is_none(m)]
            if len(non_none) != len(sp[1]):
                info["optional"] = True
            if len(non_none) == 1:
                mod, node = _resolve_alias(mod, non_none[0])
                continue
            lits = _union_literals(mod, non_none)
            if lits is not None:
                info["literal"] = lits
                return info
            info["base"] = ast.unparse(node)
            return info
        if sp and sp[0] in ("Annotated", "SkipValidation", "Final", "Required", "NotRequired", "InitVar"):
            mod, node = _resolve_alias(mod, sp[1][0])
            continue
        break
    sp = _subscript_parts(node)
    if sp and sp[0] == "Literal":
        vals: list = []
        for p in sp[1]:
            v = mod.eval(p)
            if not is_concrete(v):
                # Literal["auto", RunnerType] with RunnerType = Literal[...]
                sub = analyse_type(mod, p)
                v = sub["literal"]
                if v is None:
                    vals = [OPAQUE]
                    break
                vals.extend(v)
                continue
            vals.append(v)
        info["literal"] = vals if all(is_concrete(v) for v in vals) else None
        if info["literal"] is None:
            info["base"] = "Literal"
        return info
    if sp and sp[0] in ("List", "list", "Sequence", "Tuple", "tuple", "Set", "set"):
        info["list_elem"] = ast.unparse(sp[1][0]) if sp[1] else "str"
        info["list_elem_node"] = sp[1][0] if sp[1] else None
        info["base"] = "list"
        return info
    info["base"] = ast.unparse(node)
    info["mod"] = mod
    return info


def _flatten_union(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _flatten_union(node.left) + _flatten_union(node.right)
    return [node]


def _is_none(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and node.value is None) or (
        isinstance(node, ast.Name) and node.id == "None"
    )


def _union_literals(mod: Module, members: list[ast.AST]) -> list | None:
    """Union of several Literal[...] (possibly via aliases) -> merged values.

    A plain ``str`` member (vLLM's ``QuantizationMethods | str``) is ignored when at
    least one member is a Literal: argparse still gets the literal values as choices.
    """
    out: list = []
    found = False
    for m in members:
        t = analyse_type(mod, m)
        if t["literal"] is None:
            continue
        found = True
        out.extend(t["literal"])
    if not found:
        return None
    if len([m for m in members if analyse_type(mod, m)["literal"] is None]) and _LITERAL_UNION_STRICT:
        return None
    return out


# SGLang's own derivation only understands a bare Literal; vLLM's get_kwargs takes the
# literal members of a union (``ModelDType | torch.dtype``). The vLLM driver flips this.
_LITERAL_UNION_STRICT = True


def _union_is_open(node: ast.AST) -> bool:
    """``X | str`` (or an enum-typed field): argparse gets no choices, any string passes."""
    members = _flatten_union(node)
    sp = _subscript_parts(node)
    if sp and sp[0] in ("Union", "Optional"):
        members = sp[1]
    return any(isinstance(m, ast.Name) and m.id == "str" for m in members)


def _annotation_meta(mod: Module, ann: ast.AST) -> tuple[ast.AST, ast.AST | None, bool] | None:
    """For ``A[T, Arg(...)]``/``Annotated[T, "help"]``: (T, Arg call or help node, ok)."""
    sp = _subscript_parts(ann)
    if not sp or sp[0] not in ("A", "Annotated"):
        return None
    inner = sp[1][0]
    for meta in sp[1][1:]:
        if isinstance(meta, ast.Call) and ast.unparse(meta.func).split(".")[-1] == "Arg":
            return inner, meta, True
        if isinstance(meta, (ast.Constant, ast.JoinedStr, ast.BinOp)):
            v = mod.eval(meta)
            if isinstance(v, str) or isinstance(meta, ast.JoinedStr):
                return inner, meta, True
    return inner, None, False


def class_fields(cls: ClassRef) -> list[tuple[Module, str, ast.AnnAssign]]:
    """Annotated fields of a class and its (package-local) bases, bases first."""
    out: list[tuple[Module, str, ast.AnnAssign]] = []
    seen: set[str] = set()
    for base in cls.node.bases:
        b = cls.module.eval(base)
        if isinstance(b, ClassRef):
            for item in class_fields(b):
                if item[1] not in seen:
                    out.append(item)
                    seen.add(item[1])
    for stmt in cls.node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
            if "ClassVar" in ast.unparse(stmt.annotation):
                continue
            if name in seen:
                out = [x for x in out if x[1] != name]
            out.append((cls.module, name, stmt))
            seen.add(name)
    return out


def field_defaults_of(fields: list[tuple[Module, str, ast.AnnAssign]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mod, name, stmt in fields:
        if stmt.value is None:
            continue
        v = field_default(mod, stmt.value)
        out[name] = to_json(v) if is_concrete(v) else OPAQUE
    return out


def extract_declarative(fields: list[tuple[Module, str, ast.AnnAssign]], catalog: Catalog) -> int:
    count = 0
    for mod, name, stmt in fields:
        meta = _annotation_meta(mod, stmt.annotation)
        if meta is None or not meta[2]:
            continue
        inner, argnode, _ = meta
        kw: dict[str, ast.AST] = {}
        help_v: Any = None
        if isinstance(argnode, ast.Call):
            kw = {k.arg: k.value for k in argnode.keywords if k.arg}
            if argnode.args:
                kw.setdefault("help", argnode.args[0])
            help_v = mod.eval(kw.get("help")) if "help" in kw else ""
        else:
            help_v = mod.eval(argnode)
        if "no_cli" in kw and mod.eval(kw["no_cli"]) is True:
            continue
        cli_name = mod.eval(kw["cli_name"]) if "cli_name" in kw else None
        if not isinstance(cli_name, str):
            cli_name = "--" + name.replace("_", "-")
        aliases = mod.eval(kw["aliases"]) if "aliases" in kw else []
        if not isinstance(aliases, (list, tuple)) or not is_concrete(aliases):
            aliases = []
        entry: dict[str, Any] = {"dest": name}
        has_default = stmt.value is not None
        default = field_default(mod, stmt.value) if has_default else None
        if has_default and not is_concrete(default):
            entry["default"] = None
            entry["default_unresolved"] = _short(stmt.value)
        else:
            entry["default"] = to_json(default)
        tinfo = analyse_type(mod, inner)
        type_parser = _short(kw.get("type_parser"))
        choices_node = kw.get("choices")
        action_text = None
        nargs = None
        typ: str | None
        choices: Any = None
        choices_unresolved = False
        if choices_node is not None:
            cv = mod.eval(choices_node)
            if is_concrete(cv) and cv is not None:
                choices = to_json(cv)
            elif cv is None:
                choices = None
            else:
                choices_unresolved = True
        if "action" in kw:
            av = mod.eval(kw["action"])
            action_text = av if isinstance(av, str) else _short(kw["action"])
            typ = None
            if "nargs" in kw:
                nargs = mod.eval(kw["nargs"])
            akw = mod.eval(kw["action_kwargs"]) if "action_kwargs" in kw else None
            if isinstance(akw, dict):
                if "nargs" in akw:
                    nargs = akw["nargs"]
                if "choices" in akw and is_concrete(akw["choices"]):
                    choices = to_json(akw["choices"])
            if "action_kwargs" in kw and isinstance(kw["action_kwargs"], ast.Dict):
                for k, v in zip(kw["action_kwargs"].keys, kw["action_kwargs"].values, strict=False):
                    if isinstance(k, ast.Constant) and k.value == "type":
                        typ = _short(v)
        elif tinfo["literal"] is not None:
            if choices is None and not choices_unresolved:
                choices = to_json(tinfo["literal"])
            first = tinfo["literal"][0] if tinfo["literal"] else ""
            typ = type_parser or _py_type_name(type(first).__name__)
        elif tinfo["base"] == "list" and type_parser is None:
            typ = _py_type_name(tinfo["list_elem"])
            nargs = mod.eval(kw["nargs"]) if "nargs" in kw else "+"
        elif tinfo["base"] == "bool":
            action_text = "store_true"
            typ = None
        else:
            typ = type_parser or _py_type_name(tinfo["base"])
            if "nargs" in kw:
                nargs = mod.eval(kw["nargs"])
        entry["choices"] = choices
        if choices_unresolved:
            entry["choices_unresolved"] = True
        entry["type"] = typ
        entry["action"] = action_text
        entry["nargs"] = nargs if is_concrete(nargs) else None
        if "const" in kw:
            c = mod.eval(kw["const"])
            entry["const"] = to_json(c) if is_concrete(c) else _short(kw["const"])
        if action_text is None and typ is not None:
            req = mod.eval(kw["required"]) if "required" in kw else None
            if req is True or (req is None and not has_default):
                entry["required"] = True
        _deprecated(entry, help_v, action_text)
        catalog.add([cli_name, *list(aliases)], entry, override=False)
        count += 1
    return count


def _py_type_name(name: str | None) -> str:
    if name in ("str", "int", "float"):
        return name
    return "str"


# --------------------------------------------------------------------------------------
# Per-server drivers
# --------------------------------------------------------------------------------------


def _find_class(mod: Module, name: str) -> ClassRef | None:
    for stmt in mod.tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            return ClassRef(mod, stmt)
    return None


def _namespace_classes(mod: Module) -> list[ClassRef]:
    """Classes passed to ``collect_input_fields(...)`` (sglang >= 0.5.20)."""
    out: list[ClassRef] = []
    for node in ast.walk(mod.tree):
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).split(".")[-1] == "collect_input_fields"
            and node.args
        ):
            v = mod.eval(node.args[0])
            if isinstance(v, (list, tuple)):
                out.extend(x for x in v if isinstance(x, ClassRef))
    return out


def sglang_catalog(source: Source) -> tuple[dict, dict, dict]:
    loader = Loader(source)
    mod = loader.module("sglang.srt.server_args")
    if mod is None:
        raise SystemExit(f"{source.location}: no sglang/srt/server_args.py")
    mod.build()
    sa = _find_class(mod, "ServerArgs")
    fields: list[tuple[Module, str, ast.AnnAssign]] = []
    for ns in _namespace_classes(mod):
        fields.extend(class_fields(ns))
    if sa is not None:
        own = class_fields(sa)
        names = {f[1] for f in fields}
        fields.extend(f for f in own if f[1] not in names)
    defaults = field_defaults_of(fields)
    cat = Catalog()
    n_explicit = extract_add_argument_calls(mod, cat, defaults)
    n_decl = extract_declarative(fields, cat)
    stats = {"explicit_add_argument": n_explicit, "declarative_fields": n_decl}
    return cat.flags, cat.aliases, stats


# -- vLLM ---------------------------------------------------------------------------


def vllm_field_entry(cls: ClassRef, field: str) -> dict | None:
    """What vLLM's ``get_kwargs(cls)[field]`` gives argparse, derived statically."""
    for fmod, name, stmt in class_fields(cls):
        if name != field:
            continue
        ann = stmt.annotation
        meta = _annotation_meta(fmod, ann)
        if meta is not None:
            ann = meta[0]
        t = analyse_type(fmod, ann)
        entry: dict[str, Any] = {"dest": name}
        if stmt.value is None:
            entry["default"] = None
        else:
            d = field_default(fmod, stmt.value)
            if isinstance(d, EnumMember):
                d = d.value if is_concrete(d.value) else d.name
            if is_concrete(d):
                entry["default"] = to_json(d)
            else:
                entry["default"] = None
                entry["default_unresolved"] = _short(stmt.value)
        choices: Any = t["literal"]
        base = t["base"]
        enum_cls = None
        if choices is None and base and base not in ("bool", "list", "str", "int", "float"):
            b = t["mod"].eval(ast.parse(base, mode="eval").body) if _is_dotted(base) else None
            if isinstance(b, ClassRef) and b.is_enum():
                enum_cls = b
        entry["action"] = None
        entry["nargs"] = None
        if choices is not None:
            entry["type"] = _py_type_name(type(choices[0]).__name__) if choices else "str"
            if _union_is_open(_resolve_alias(fmod, ann)[1]):
                # `X | str`: argparse takes any string; these are the known values
                entry["choices"] = to_json(choices)
                entry["choices_open"] = True
            else:
                entry["choices"] = _sorted_choices(to_json(choices))  # get_kwargs sorts them
        elif enum_cls is not None:
            # parsed by the enum's own type function, not argparse choices: the member names
            entry["type"] = "str"
            entry["choices"] = [m.name for m in enum_cls.members()]
            entry["choices_open"] = True
            entry["choices_from_enum"] = enum_cls.name
        elif base == "bool":
            entry["type"] = None
            entry["action"] = "argparse.BooleanOptionalAction"
            entry["choices"] = None
        elif base == "list":
            entry["type"] = _py_type_name(t["list_elem"])
            entry["nargs"] = "+"
            entry["choices"] = None
            elem = t.get("list_elem_node")
            if elem is not None:
                lit = analyse_type(t["mod"], elem)["literal"]
                if lit:
                    entry["choices"] = _sorted_choices(to_json(lit))
                    entry["type"] = _py_type_name(type(lit[0]).__name__)
        else:
            entry["type"] = base if base in ("int", "float") else "str"
            entry["choices"] = None
        return entry
    return None


def _sorted_choices(values: list) -> list:
    if all(isinstance(v, type(values[0])) for v in values):
        return sorted(values)
    return sorted(values, key=str)


def _is_dotted(text: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_][\w.]*", text))


def _vllm_add_argument_calls(mod: Module, catalog: Catalog) -> int:
    """``group.add_argument("--x", **model_kwargs["x"])`` where ``model_kwargs = get_kwargs(C)``."""
    count = 0
    for func in ast.walk(mod.tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        kw_sources: dict[str, Any] = {}  # var -> ClassRef (get_kwargs) or (ClassRef, field)
        calls: list[ast.Call] = []
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                tgt, val = node.targets[0], node.value
                if not isinstance(tgt, ast.Name):
                    continue
                if (
                    isinstance(val, ast.Call)
                    and ast.unparse(val.func).split(".")[-1] == "get_kwargs"
                    and val.args
                ):
                    c = mod.eval(val.args[0])
                    if isinstance(c, ClassRef):
                        kw_sources[tgt.id] = c
                elif (
                    isinstance(val, ast.Subscript)
                    and isinstance(val.value, ast.Name)
                    and isinstance(val.slice, ast.Constant)
                ):
                    base = kw_sources.get(val.value.id)
                    if isinstance(base, ClassRef):
                        kw_sources[tgt.id] = (base, val.slice.value)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                calls.append(node)
        for call in calls:
            names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if not names or not names[0].startswith("-"):
                continue
            long_names = [n for n in names if n.startswith("--")] or names
            entry: dict[str, Any] | None = None
            overrides: list[tuple[str, ast.AST]] = []
            for k in call.keywords:
                if k.arg is not None:
                    continue
                src: Any = None
                v = k.value
                if isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name):
                    base = kw_sources.get(v.value.id)
                    if isinstance(base, ClassRef) and isinstance(v.slice, ast.Constant):
                        src = (base, v.slice.value)
                elif isinstance(v, ast.Name):
                    src = kw_sources.get(v.id)
                elif isinstance(v, ast.Dict):
                    # **{**cache_kwargs["x"], "default": None}
                    for dk, dv in zip(v.keys, v.values, strict=False):
                        if dk is None and isinstance(dv, ast.Subscript) and isinstance(dv.value, ast.Name):
                            base = kw_sources.get(dv.value.id)
                            if isinstance(base, ClassRef) and isinstance(dv.slice, ast.Constant):
                                src = (base, dv.slice.value)
                        elif isinstance(dk, ast.Constant) and dk.value in ("default", "choices", "nargs"):
                            overrides.append((dk.value, dv))
                if isinstance(src, tuple):
                    entry = vllm_field_entry(src[0], src[1])
                    if entry is not None:
                        entry["from_config"] = f"{src[0].name}.{src[1]}"
            if entry is None:
                sub = Catalog()
                if extract_add_argument_calls(mod, sub, {}, scope_node=ast.Module([ast.Expr(call)], [])):
                    entry = next(iter(sub.flags.values()))
                    entry.pop("aliases", None)
                else:
                    continue
            else:
                explicit = [(k.arg, k.value) for k in call.keywords if k.arg]
                for arg, node in overrides + explicit:
                    if arg in ("choices", "default", "nargs", "type", "action"):
                        val = mod.eval(node)
                        if arg in ("type", "action") or not is_concrete(val):
                            val = val if isinstance(val, str) else _short(node)
                        entry[arg] = to_json(val)
            entry["dest"] = long_names[0].lstrip("-").replace("-", "_")
            catalog.add(long_names + [n for n in names if n not in long_names], entry)
            count += 1
    return count


def vllm_catalog(source: Source) -> tuple[dict, dict, dict]:
    global _LITERAL_UNION_STRICT
    _LITERAL_UNION_STRICT = False
    try:
        return _vllm_catalog(source)
    finally:
        _LITERAL_UNION_STRICT = True


def _vllm_catalog(source: Source) -> tuple[dict, dict, dict]:
    loader = Loader(source)
    mod = loader.module("vllm.engine.arg_utils")
    if mod is None:
        raise SystemExit(f"{source.location}: no vllm/engine/arg_utils.py")
    mod.build()
    cat = Catalog()
    # vLLM's FlexibleArgumentParser pairs --enable-X with --disable-X (and vice versa)
    # instead of argparse's --no-X, in the releases whose argparse_utils say so.
    utils = source.read("vllm/utils/argparse_utils.py") or ""
    if '"--disable-' in utils or "'--disable-" in utils:
        cat.negation = "enable_disable"
    stats: dict[str, int] = {"engine_args": _vllm_add_argument_calls(mod, cat)}
    # `vllm serve` frontend flags: every field of FrontendArgs (added in a loop)
    for name in ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.common.cli_args"):
        m2 = loader.module(name)
        if m2 is None:
            continue
        m2.build()
        fa = _find_class(m2, "FrontendArgs")
        n = 0
        if fa is not None:
            for _, field, _ in class_fields(fa):
                flag = "--" + field.replace("_", "-")
                e = vllm_field_entry(fa, field)
                if e is not None and flag not in cat.flags:
                    e["from_config"] = f"FrontendArgs.{field}"
                    cat.add([flag], e)
                    n += 1
        n += _vllm_add_argument_calls(m2, cat)
        stats[name.rsplit(".", 2)[-2] + "_frontend"] = n
    return cat.flags, cat.aliases, stats


# --------------------------------------------------------------------------------------


def _version_key(v: str) -> tuple:
    parts = re.findall(r"\d+|[a-z]+", v)
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="+", help="wheels or package directories")
    ap.add_argument("--server", choices=["sglang", "vllm"], default="sglang")
    ap.add_argument("--out", required=True, help="output JSON file")
    args = ap.parse_args(argv)
    versions: dict[str, dict] = {}
    aliases: dict[str, dict] = {}
    stats: dict[str, dict] = {}
    for loc in args.sources:
        src = Source(loc, args.server)
        ver = src.version()
        fn = sglang_catalog if args.server == "sglang" else vllm_catalog
        flags, al, st = fn(src)
        versions[ver] = flags
        aliases[ver] = al
        stats[ver] = {**st, "flags": len(flags)}
        print(f"{args.server} {ver}: {len(flags)} flags {st}", file=sys.stderr)
    ordered = sorted(versions, key=_version_key)
    srcs = " ".join(f"WHEELS/{Path(s).name}" if s.endswith(".whl") else s for s in args.sources)
    pins = " ".join(f"{args.server}=={v}" for v in ordered)
    out = {
        "generated_by": f"python tools/gen_flag_catalog.py --server {args.server} --out {args.out} {srcs}",
        "wheels_from": f"for spec in {pins}; do pip download --no-deps -d WHEELS $spec; done",
        "server": args.server,
        "version_order": ordered,
        "versions": versions,
        "aliases": aliases,
        "stats": stats,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=None, separators=(",", ":"), sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
