"""Jinja2 topology templates: a layered search path and declared, typed template variables.

A template is a directory `<name>/` holding `topology.yml.j2` and `vars.yml` (its description and
every variable with type, default, range and help). Directories earlier on the search path win,
so a user's `templates/leaf-spine/` overrides the bundled one (netlab's layering).

labctl renders as root, so a template is untrusted code: it renders in Jinja's immutable sandbox
(no attribute of Python's internals, nothing that runs a command), its `{% import "lib/..." %}`
finds macros only in the tree it came from (a lab folder's lib/ cannot replace the bundled macros
of a bundled template), and as root a template tree that group or others may write is refused.
String variables reach the YAML quoted, so a value cannot add keys to what the template writes.
"""
from __future__ import annotations

import difflib
import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import jinja2
import jinja2.sandbox

from labctl.errors import InputError, Where
from labctl.topology.yamlpos import load_yaml_file
from labctl.units import parse_duration_ns, parse_rate, parse_size

TEMPLATE_FILE = "topology.yml.j2"
VARS_FILE = "vars.yml"
_TYPES = ("int", "float", "bool", "str", "rate", "size", "duration")
TEMPLATE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


class Quoted(str):
    """A user's string variable: the renderer writes it as a quoted YAML scalar."""


def _finalize(value):
    return json.dumps(str(value)) if isinstance(value, Quoted) else value


def bundled_dir(subdir: str = "templates") -> Path:
    """The project's own templates/ (a source checkout or editable install), else the installed copy."""
    here = Path(__file__).resolve().parents[2] / subdir
    if here.is_dir():
        return here
    import sys
    return Path(sys.prefix) / "share" / "labctl" / subdir


def search_path(lab_file: Path | None, extra: tuple[str, ...] = ()) -> list[Path]:
    """Lab dir, then --templates, $LABCTL_TEMPLATES, the user's dir, the bundled templates."""
    path = []
    if lab_file is not None:
        path.append(lab_file.resolve().parent / "templates")
    path += [Path(p) for p in extra]
    path += [Path(p) for p in os.environ.get("LABCTL_TEMPLATES", "").split(os.pathsep) if p]
    path.append(Path.home() / ".config" / "labctl" / "templates")
    path.append(bundled_dir())
    return [p for p in path if _readable_dir(p)]


def _readable_dir(p: Path) -> bool:
    """An unreadable directory on the path (another user's home under sudo) is skipped, not fatal."""
    try:
        return p.is_dir() and os.access(p, os.R_OK | os.X_OK)
    except OSError:
        return False


@dataclass
class VarSpec:
    name: str
    type: str
    default: object
    help: str
    min: float | None = None
    max: float | None = None
    choices: list | None = None


@dataclass
class Template:
    name: str
    directory: Path
    description: str
    vars: dict[str, VarSpec]


def find_template(name: str, path: list[Path], where: Where) -> Template:
    if not isinstance(name, str) or not TEMPLATE_NAME.fullmatch(name):
        raise InputError(where, f"{name!r} is not a template name",
                         "a template is named by its directory: lower-case letters, digits, '-' and '_' "
                         "(`labctl templates` lists them)")
    for d in path:
        if (d / name / TEMPLATE_FILE).is_file():
            return _read_template(name, d / name)
    known = sorted({p.name for d in path for p in d.iterdir() if (p / TEMPLATE_FILE).is_file()})
    hint = _did_you_mean(name, known)
    raise InputError(where, f"unknown template {name!r}{hint}",
                     f"use one of: {', '.join(known) or '(none found)'}; searched {', '.join(map(str, path))}")


def _read_template(name: str, directory: Path) -> Template:
    spec_file = directory / VARS_FILE
    spec = load_yaml_file(spec_file, "template's vars.yml", "description:, vars:",
                          "templates/leaf-spine/vars.yml")[1] if spec_file.is_file() else {}
    variables = {}
    declared = spec.get("vars") or {}
    if not isinstance(declared, dict):
        raise InputError(Where(str(spec_file), key="vars"), "vars must map each variable to its declaration")
    for var, s in declared.items():
        if not isinstance(s, dict) or s.get("type") not in _TYPES:
            s = s if isinstance(s, dict) else {}
            raise InputError(Where(str(spec_file), key=f"vars.{var}.type"),
                             f"template variable type {s.get('type')!r} is not one of {', '.join(_TYPES)}")
        variables[var] = VarSpec(var, s["type"], s.get("default"), s.get("help", ""),
                                 s.get("min"), s.get("max"), s.get("choices"))
    return Template(name, directory, spec.get("description", ""), variables)


def resolve_vars(tpl: Template, given: dict, where_of) -> dict:
    """Check and convert the lab's vars against the template's declaration; fill in defaults.

    `where_of(key)` gives the Where of a var in the lab file (or of --set on the command line).
    """
    out = {}
    for key, value in given.items():
        if key not in tpl.vars:
            hint = _did_you_mean(key, list(tpl.vars))
            raise InputError(where_of(key), f"template {tpl.name!r} has no variable {key!r}{hint}",
                             f"its variables are: {', '.join(tpl.vars)} (see `labctl templates {tpl.name}`)")
        out[key] = _convert(tpl.vars[key], value, where_of(key))
    for key, spec in tpl.vars.items():
        if key not in out:
            if spec.default is None:
                raise InputError(where_of(None), f"template {tpl.name!r} needs variable {key!r} ({spec.help})",
                                 f"add `{key}: ...` under vars, or pass --set {key}=...")
            out[key] = _convert(spec, spec.default, Where(str(tpl.directory / VARS_FILE), key=f"vars.{key}"))
    return out


# YAML 1.1 (PyYAML) reads 1e9 and 2.5e3 as strings: a float needs a dot and a signed exponent there
_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def _number(value):
    """A number written as text (`--set distance=1e9`) as that number; anything else as it is."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        number = float(value)
        return int(number) if number.is_integer() and abs(number) < 2**63 else number
    return value


def _convert(spec: VarSpec, value, where: Where):
    def bad(why: str):
        return InputError(where, f"template variable {spec.name!r}: {why}", _allowed(spec))

    try:
        if spec.type == "int":
            value = _number(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(f"expected a whole number, got {value!r}")
        elif spec.type == "float":
            value = _number(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad(f"expected a number, got {value!r}")
            value = float(value)
        elif spec.type == "bool":
            if not isinstance(value, bool):
                raise bad(f"expected true or false, got {value!r}")
        elif spec.type == "str":
            if isinstance(value, (dict, list)):
                raise bad(f"expected a string, got {value!r}")
            value = Quoted(value)
        elif spec.type == "rate":
            # a template divides by its rates (a port's share, a ratio of two paths): 0 is no rate
            if parse_rate(value) <= 0:
                raise bad(f"{value!r} is not a rate a link can run at: a rate must be more than 0")
        elif spec.type == "size":
            parse_size(value)
        elif spec.type == "duration":
            parse_duration_ns(value)
    except ValueError as exc:
        raise bad(str(exc)) from None
    if spec.choices is not None and value not in spec.choices:
        raise bad(f"{value!r} is not one of {spec.choices}")
    if isinstance(value, float) and not math.isfinite(value):
        raise bad(f"{value} is not a finite number")      # NaN passes every < and >
    if spec.min is not None and isinstance(value, (int, float)) and value < spec.min:
        raise bad(f"{_shown(value)} is below the minimum {spec.min}")
    if spec.max is not None and isinstance(value, (int, float)) and value > spec.max:
        raise bad(f"{_shown(value)} is above the maximum {spec.max}")
    return value


def _shown(value) -> str:
    """A number as people write it: 1000000000 for 1e9, 2.5 for 2.5."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() and abs(value) < 1e16 else f"{value:g}"


def _allowed(spec: VarSpec) -> str | None:
    """The fix of a bad value: what the variable is, and the values it takes."""
    span = ""
    if spec.type in ("int", "float") and (spec.min is not None or spec.max is not None):
        low = "" if spec.min is None else f"from {spec.min} "
        high = "" if spec.max is None else f"up to {spec.max}"
        span = f"{'a whole number' if spec.type == 'int' else 'a number'} {low}{high}".strip()
    elif spec.type == "rate":
        span = "a rate above 0, e.g. 400G"
    parts = [f"{spec.name} is {spec.help}" if spec.help else "", f"give {span}" if span else ""]
    return "; ".join(x for x in parts if x) or None


class TemplateFailure(Exception):
    """Raised by `fail()` inside a template: a combination of variables the template cannot build.
    `var`: the variable at fault, where the error is then located (`--set` or its line under vars:)."""

    def __init__(self, message: str, var: str | None = None):
        super().__init__(message)
        self.var = var


def _fail(message: str, var: str | None = None):
    raise TemplateFailure(message, var)


def _check_not_writable_by_others(tpl: Template, where: Where) -> None:
    """As root: a template is code root runs, and it may include any file of its tree, so nobody but
    root may be able to change any of them (a symlink counts as the file it names, and as itself)."""
    if os.geteuid() != 0:
        return
    tree = tpl.directory.parent
    for p in [tree, *sorted(tree.rglob("*"))]:
        for st in _stats(p):
            if st.st_uid != 0:
                raise InputError(where, f"template {tpl.name!r}: {p} is owned by uid {st.st_uid}, and labctl "
                                 "runs templates as root", f"sudo chown root: {p} (or keep your templates in "
                                 "a directory of root's)")
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise InputError(where, f"template {tpl.name!r}: {p} can be written by group or others "
                                 f"(mode {stat.S_IMODE(st.st_mode):o}), and labctl runs templates as root",
                                 f"chmod go-w {p}")


def _stats(p: Path) -> list[os.stat_result]:
    out = []
    for follow in (False, True):
        try:
            out.append(os.stat(p, follow_symlinks=follow))
        except OSError:
            pass
    return out


def _is_size(value) -> bool:
    try:
        parse_size(value)
    except ValueError:
        return False
    return True


class _TreeLoader(jinja2.FileSystemLoader):
    """Templates from one tree only: a name that resolves outside it (a symlink in the tree to a
    file of root's) is refused, not read (a lab author's link had `plan` print a root-only file)."""

    def get_source(self, environment, template):
        source, filename, uptodate = super().get_source(environment, template)
        real = os.path.realpath(filename)
        if not any(real.startswith(os.path.realpath(p) + os.sep) for p in self.searchpath):
            raise jinja2.sandbox.SecurityError(f"{template} leads out of the template tree (to {real})")
        return source, filename, uptodate


def _environment(root: Path) -> jinja2.Environment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        # only the tree the template came from: its own lib/ macros, never another directory's
        loader=_TreeLoader(str(root)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_finalize,
    )
    env.globals["fail"] = _fail
    env.filters["rate"] = parse_rate
    env.filters["size"] = parse_size
    env.tests["size"] = _is_size      # a string variable that may hold a size: `x is size and (x | size) < ...`
    return env


RENDER_LIMIT_S = 30        # a template is a few loops over a lab's nodes: seconds even at 1,024 GPUs


class _TooLong(Exception):
    pass


def _limited(render_call, name: str, where: Where):
    """`render_call()` stopped after RENDER_LIMIT_S (in the main thread, where a timer signal can
    reach it): nested loops in a lab author's template would otherwise hold `plan` and `up` for ever."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return render_call()

    def expired(signum, frame):
        raise _TooLong()
    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, RENDER_LIMIT_S)
    try:
        return render_call()
    except _TooLong:
        raise InputError(where, f"{name} was still rendering after {RENDER_LIMIT_S} s",
                         "a template formats the lab's values: loop over the nodes and ports it is given, "
                         "not over large ranges") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def render_file(root: Path, relpath: str, variables: dict, where: Where) -> str:
    """A node's file (an FRR configuration) from a template under `root`, in the same sandbox,
    given the node as the plan made it."""
    if relpath.startswith("/") or ".." in Path(relpath).parts:
        raise InputError(where, f"{relpath!r} is not a path inside the template tree",
                         "name it relative to the tree, e.g. lib/frr/bgp.conf.j2")
    try:
        template = _environment(root).get_template(relpath)
        return _limited(lambda: template.render(**variables), relpath, where)
    except jinja2.TemplateNotFound:
        raise InputError(where, f"there is no template {relpath!r} under {root}",
                         "check the name (relative to the lab's template tree, or to the lab file)") from None
    except jinja2.sandbox.SecurityError as exc:
        raise InputError(where, f"{relpath} tried something the sandbox forbids: {exc}", "remove the expression") from None
    except jinja2.UndefinedError as exc:
        raise InputError(where, f"{relpath} uses an undefined variable: {exc.message}",
                         "give it under vars:, or use what the node provides (node.name, node.interfaces, ...)") from None
    except jinja2.TemplateError as exc:
        raise InputError(Where(str(root / relpath), getattr(exc, "lineno", None)), f"template error: {exc}",
                         "fix the template") from None


def render(tpl: Template, variables: dict, path: list[Path], where: Where, where_of=None) -> str:
    """`where_of(var)` locates a `fail(message, var)` at that variable (as resolve_vars's)."""
    _check_not_writable_by_others(tpl, where)
    env = _environment(tpl.directory.parent)
    try:
        template = env.get_template(f"{tpl.name}/{TEMPLATE_FILE}")
        return _limited(lambda: template.render(**variables), f"template {tpl.name!r}", where)
    except jinja2.sandbox.SecurityError as exc:
        raise InputError(Where(str(tpl.directory / TEMPLATE_FILE)), f"template {tpl.name!r} tried something "
                         f"the sandbox forbids: {exc}", "templates may only format the variables they are "
                         "given; remove the expression") from None
    except TemplateFailure as exc:
        at = where_of(exc.var) if exc.var and where_of and exc.var in tpl.vars else where
        raise InputError(at, f"template {tpl.name!r} cannot build this: {exc}",
                         f"change {exc.var if at is not where else 'the vars'} (see `labctl templates {tpl.name}`)") from None
    except jinja2.UndefinedError as exc:
        raise InputError(where, f"template {tpl.name!r} uses an undefined variable: {exc.message}",
                         f"declare it in {tpl.directory / VARS_FILE}") from None
    except jinja2.TemplateError as exc:
        lineno = getattr(exc, "lineno", None)
        raise InputError(Where(str(tpl.directory / TEMPLATE_FILE), lineno), f"template error: {exc}",
                         "fix the template") from None
    except (ArithmeticError, TypeError, ValueError, RecursionError, MemoryError) as exc:
        raise InputError(Where(str(tpl.directory / TEMPLATE_FILE)), f"template {tpl.name!r} failed: "
                         f"{type(exc).__name__}: {exc}", "check the variables' values "
                         f"(`labctl templates {tpl.name}`)") from None


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def did_you_mean(word: str, options: list[str]) -> str:
    return _did_you_mean(word, options)


def list_templates(path: list[Path]) -> list[Template]:
    seen: dict[str, Template] = {}
    for d in path:
        for p in sorted(d.iterdir()):
            if (p / TEMPLATE_FILE).is_file() and p.name not in seen:
                seen[p.name] = _read_template(p.name, p)
    return list(seen.values())
