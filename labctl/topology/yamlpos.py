"""YAML loading that remembers where every key and list item came from.

Validation errors point at a line, so the loader returns the plain data together with a map from
key paths (tuples of keys and list indexes) to 1-based line numbers.

Input is hostile (labctl runs as root): nesting is capped before anything recursive sees the
document, and aliases may expand to a bounded number of values ("billion laughs" is 542 bytes).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import yaml

from labctl.errors import InputError, Where

Path = tuple  # of str | int

MAX_DEPTH = 64          # a lab file is a handful of levels deep
MAX_REPEATS = 10_000    # values an alias repeats: real files use a few, "billion laughs" billions
MAX_BYTES = 16 << 20    # the largest input file read (the bundled ones are a few kB)
MAX_INT_BITS = 1024     # past a double's range (about 300 digits): no rate, size or count is that large


@dataclass
class SourceMap:
    file: str
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int | None:
        """The line of the deepest known prefix of `path` (a missing key points at its parent)."""
        for n in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:n]))
            if line is not None:
                return line
        return None

    def where(self, path: Path) -> Where:
        return Where(self.file, self.line_of(path), dotted(path) or None)


def dotted(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def load_yaml(text: str, file: str) -> tuple[object, SourceMap]:
    smap = SourceMap(file)
    try:
        _check_depth(text, file)
        node = yaml.compose(text, Loader=_COMPOSER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(Where(file, line), f"not valid YAML: {problem}",
                         "check indentation and quoting near that line") from None
    if node is None:
        return None, smap
    return _convert(node, (), smap, set(), [0]), smap


def _check_depth(text: str, file: str) -> None:
    """Walk the event stream (libyaml's parser does not recurse) and refuse deep nesting."""
    depth = 0
    for event in yaml.parse(text, Loader=_COMPOSER):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise InputError(Where(file, event.start_mark.line + 1),
                                 f"nested more than {MAX_DEPTH} levels deep",
                                 "a lab, workload or experiment is a few levels deep: flatten it")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def load_yaml_file(path, what: str, keys: str, example: str, opened: dict | None = None) -> tuple[str, dict, SourceMap]:
    """Read an input file that must be a YAML mapping: (text, data, source map), or a located error.

    `what` names the file for messages ("lab file"), `keys` hints at its top-level keys,
    `example` is a bundled file to start from; `opened` is filled as read_input fills it.
    """
    raw = read_input(path, what, example, opened)
    text = decode(raw, str(path))
    data, smap = load_yaml(text, str(path))
    if not isinstance(data, dict):
        raise InputError(Where(str(path), 1), f"a {what} is a YAML mapping ({keys} ...)", f"start from {example}")
    return text, data, smap


def read_input(path, what: str, example: str, opened: dict | None = None) -> bytes:
    """The bytes of an input file, only if it is a regular file of at most MAX_BYTES: a FIFO would
    block the read for ever, /dev/zero or /dev/urandom would never end (labctl run /dev/zero).
    `opened` (a dict) gets the file that was read: its real path ("path") and its fstat ("stat"),
    which the trust model judges (a check by name, later, could judge another file)."""
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)    # a FIFO's open waits for a writer
    except (OSError, ValueError) as exc:       # ValueError: a NUL byte in the path
        raise InputError(Where(str(path)), f"cannot read the {what}: {getattr(exc, 'strerror', None) or exc}",
                         f"check the path (e.g. {example})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(Where(str(path)), f"the {what} is not a regular file (a device, a FIFO or a "
                             "directory)", f"give a YAML file (e.g. {example})")
        if opened is not None:
            opened.update(path=os.readlink(f"/proc/self/fd/{fd}"), stat=st)
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise InputError(Where(str(path)), f"cannot read the {what}: {exc.strerror}",
                         f"check the path (e.g. {example})") from None
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        raise InputError(Where(str(path)), f"the {what} is larger than {MAX_BYTES >> 20} MB",
                         "a lab, workload or experiment is a few kB: generate a template instead")
    return b"".join(chunks)


def decode(raw: bytes, file: str) -> str:
    """UTF-8 text, or an error naming the line of the first byte that is not."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise InputError(Where(file, line), f"byte 0x{raw[exc.start]:02x} is not UTF-8 text",
                         "save the file as UTF-8") from None


def _convert(node: yaml.Node, path: Path, smap: SourceMap, seen: set, repeats: list) -> object:
    if len(path) > MAX_DEPTH:            # the text is no deeper (_check_depth): aliases nest it, or loop
        raise InputError(Where(smap.file, node.start_mark.line + 1),
                         f"aliases nest values more than {MAX_DEPTH} levels deep (an alias inside the value it names?)",
                         "write the values out")
    if id(node) in seen:                 # an alias: the same node once more
        repeats[0] += 1
        if repeats[0] > MAX_REPEATS:
            raise InputError(Where(smap.file, node.start_mark.line + 1),
                             f"aliases repeat more than {MAX_REPEATS:,} values (aliases of aliases?)",
                             "write the values out, or use fewer nested aliases")
    else:
        seen.add(id(node))
    smap.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise InputError(Where(smap.file, key_node.start_mark.line + 1, dotted(path) or None),
                                 "YAML merge keys (<<) are not read here",
                                 "write the merged keys out (an alias of a whole value still works)")
            key = _scalar(key_node, smap)  # scalar keys only
            if not isinstance(key, (str, int, float, bool)):
                raise InputError(Where(smap.file, key_node.start_mark.line + 1),
                                 "mapping keys must be plain names", "write the key as a plain string")
            key = str(key)
            if key in out:
                raise InputError(Where(smap.file, key_node.start_mark.line + 1, dotted(path + (key,))),
                                 f"duplicate key {key!r}", "remove or rename one of the two entries")
            smap.lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _convert(value_node, path + (key,), smap, seen, repeats)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, path + (i,), smap, seen, repeats) for i, item in enumerate(node.value)]
    return _scalar(node, smap, path)


def _scalar(node: yaml.Node, smap: SourceMap, path: Path = ()) -> object:
    """A scalar as YAML's safe types read it, or a located error: an unknown tag (a python/name,
    a !custom), a malformed timestamp or number, an integer past Python's digit limit."""
    where = Where(smap.file, node.start_mark.line + 1, dotted(path) or None)
    try:
        value = yaml.SafeLoader.construct_object(_LOADER, node)
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            # hex, binary or base-60 skip Python's digit limit: such a number could not even be
            # printed in an error message later (ValueError), let alone be a rate or a size
            raise InputError(where, f"an integer of more than {MAX_INT_BITS * 3 // 10} digits is not a value "
                             "labctl reads", "write a number of a sensible size (or quote it to keep it as text)")
        if isinstance(value, str):
            _refuse_unprintable(value, where)
        return value
    except yaml.constructor.ConstructorError:
        raise InputError(where, f"the tag {node.tag!r} is not one labctl reads",
                         "remove the tag: values are plain strings, numbers, booleans, lists and mappings") from None
    except InputError:
        raise
    except Exception as exc:      # PyYAML's constructors fail every way on hostile text (`!!timestamp x`)
        raise InputError(where, f"{str(node.value)[:40]!r} is not a value labctl can read: {str(exc)[:80]}",
                         "quote it to keep it as text, or write a plain number or date") from None


def _refuse_unprintable(text: str, where: Where) -> None:
    """labctl shows what a file says (its plan lists exec lines before root trusts them), so text
    holds nothing a terminal acts on: an escape sequence in a double-quoted string ("\\e[2K") erased
    the line `labctl plan` showed and printed a harmless one in its place. Line breaks and tabs stay."""
    bad = next((c for c in text if not c.isprintable() and c not in "\n\t"), None)
    if bad is not None:
        raise InputError(where, f"the text holds a control character (U+{ord(bad):04X}{', ESC' if bad == chr(27) else ''})"
                         ": labctl prints what a file says, and a terminal would act on it rather than show it",
                         "remove it: write plain text (an escape such as \\e or \\x1b in double quotes makes one)")


_LOADER = yaml.SafeLoader("")
# libyaml's composer gives the same nodes and marks ~10x faster; pure Python where it is missing
_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
