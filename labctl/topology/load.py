"""Lab file → (rendered YAML) → validated TopologySpec, with errors that point at the file and line."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from labctl.errors import InputError, Where
from labctl.topology import clab, templates as tpl
from labctl.names import valid_lab_name
from labctl.topology.check import check_topology
from labctl.topology.schema import TopologySpec
from labctl.topology.yamlpos import SourceMap, load_yaml, load_yaml_file

TEMPLATE_LAB_KEYS = ("name", "description", "template", "vars")
# What one machine builds: every node is a namespace holding sockets, routes and qdiscs in the
# kernel, every link a veth pair with an HTB tree per end. A 1,024-GPU pod is ~1,200 nodes.
MAX_NODES = 4096
MAX_LINKS = 16384


@dataclass
class Loaded:
    topology: TopologySpec
    source: SourceMap  # positions in the text that was validated (rendered text for template labs)
    text: str          # that text
    file: Path
    template: str | None = None
    template_root: Path | None = None   # the tree the lab's template came from (node file templates live there)
    set_by: tuple[dict, ...] = ()       # files whose `set:` changed it (an experiment), as read_as: trusted as the lab itself
    read_as: dict | None = None         # the lab file that was read: its real path and fstat (yamlpos.read_input)


def parse_sets(sets: tuple[str, ...] | list[str]) -> dict:
    """--set key=value pairs; values are YAML scalars (`--set spines=4`, `--set rate=200G`)."""
    out = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(Where("--set"), f"{item!r} is not key=value", "write it like --set spines=4")
        try:
            out[key.strip()] = load_yaml(value, "--set")[0] if value.strip() else ""
        except InputError as exc:
            raise InputError(Where("--set", key=key.strip()), f"{value!r} is not a YAML value: {exc.message}",
                             "quote it the way a shell passes it, e.g. --set 'wan_buffer=2MB'") from None
    return out


def render_topology(file: str | Path, sets=(), template_dirs=(), maps=None) -> tuple[str, SourceMap, str | None]:
    """The full lab YAML text: the file itself, or what its template renders to. `maps`
    (clabmaps.ImportMaps) maps a containerlab file's kinds and images."""
    text, smap, template, _, _ = _render(file, sets, template_dirs, maps)
    return text, smap, template


def _refuse_other_kinds(data: dict, smap, path: Path) -> None:
    """An experiment or a workload given where a lab file goes (`labctl plan experiments/x.yml`) is
    named for what it is, rather than read as a containerlab file with unknown keys."""
    if "nodes" in data or "topology" in data and isinstance(data["topology"], dict) or "template" in data:
        return
    if "steps" in data:
        target = data.get("topology")
        raise InputError(smap.where(("steps",)), f"{path} is an experiment (it has steps:), not a lab file",
                         f"run it with `labctl run {path}`" + (f", or plan its lab: `labctl plan {path.parent / target}`"
                                                                if isinstance(target, str) else ""))
    played = [k for k in ("collective", "fsdp", "train", "flows") if k in data]
    if played:
        raise InputError(smap.where((played[0],)), f"{path} is a workload (it has {played[0]}:), not a lab file",
                         f"play it on a lab that is up: `labctl run {path} --lab LAB`")


def _render(file: str | Path, sets=(), template_dirs=(), maps=None, opened: dict | None = None):
    """(text, its source map, template name or None, the parsed data, the template's tree or None),
    parsing each text once."""
    path = Path(file)
    text, data, smap = load_yaml_file(path, "lab file", "name:, nodes:, links:", "topologies/leaf-spine.yml",
                                      opened)
    overrides = parse_sets(sets)
    _refuse_other_kinds(data, smap, path)
    if clab.is_clab(data):
        text = clab.to_labctl(data, smap, str(path), maps)
        data, smap = load_yaml(text, f"{path} (read as containerlab; see `labctl render {path}`)")
    if "template" not in data:
        if overrides:
            for key, value in overrides.items():
                _set_dotted(data, key, value)
            text = yaml.safe_dump(data, sort_keys=False)
            data, smap = load_yaml(text, f"{path} (with --set)")
        return text, smap, None, data, None

    for key in data:
        if key not in TEMPLATE_LAB_KEYS:
            raise InputError(smap.where((key,)),
                             f"unknown key {key!r} in a lab that uses a template",
                             f"a template lab has only {', '.join(TEMPLATE_LAB_KEYS)}; "
                             "put template settings under vars:")
    name = data["template"]
    if not isinstance(name, str):
        raise InputError(smap.where(("template",)), "template must be a template name, e.g. leaf-spine")
    search = tpl.search_path(path, tuple(template_dirs))
    template = tpl.find_template(name, search, smap.where(("template",)))
    given = data.get("vars") or {}
    if not isinstance(given, dict):
        raise InputError(smap.where(("vars",)), "vars must be a mapping of template variables")
    given = {**given, **overrides}

    def where_of(key):
        if key is None:
            return smap.where(("vars",) if "vars" in data else ("template",))
        if key in overrides:
            return Where("--set", key=key)
        return smap.where(("vars", key))

    variables = tpl.resolve_vars(template, given, where_of)
    lab_name = data.get("name", name)
    if not valid_lab_name(lab_name):
        raise InputError(smap.where(("name",) if "name" in data else ("template",)),
                         f"{lab_name!r} is not a lab name",
                         "the lab name is lower-case letters, digits and '-', starting with a letter, at most 24 "
                         "characters (it prefixes every namespace)")
    variables["name"] = lab_name
    rendered = tpl.render(template, variables, search, smap.where(("template",)), where_of)
    origin = f"{path} (rendered from template {name}; see `labctl render {path}`)"
    rdata, rmap = load_yaml(rendered, origin)
    if isinstance(rdata, dict) and data.get("description"):
        rdata["description"] = data["description"]
    return rendered, rmap, name, rdata, template.directory.parent


def _set_dotted(data: dict, key: str, value) -> None:
    parts = key.split(".")
    cur = data
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
        if not isinstance(cur, dict):
            raise InputError(Where("--set", key=key), f"{part!r} is not a mapping", "set a leaf key")
    cur[parts[-1]] = value


def load_topology(file: str | Path, sets=(), template_dirs=(), name: str | None = None, maps=None) -> Loaded:
    opened: dict = {}
    text, smap, template, data, root = _render(file, sets, template_dirs, maps, opened)
    loaded = _validated(data, smap, text, Path(file), template, name)
    loaded.template_root = root
    loaded.read_as = opened or None
    return loaded


def load_topology_text(text: str, origin: str, name: str | None = None) -> Loaded:
    """A full lab given as YAML text (the Python API's Topology builder), checked exactly as a file;
    errors name `origin` and the line of the text."""
    data, smap = load_yaml(text, origin)
    return _validated(data, smap, text, Path(origin), None, name)


def _validated(data, smap: SourceMap, text: str, file: Path, template: str | None, name: str | None) -> Loaded:
    if not isinstance(data, dict):
        raise InputError(Where(smap.file, 1), "the lab is empty", "add name:, nodes: and links:")
    if name is not None:
        data["name"] = name
    for key, limit in (("nodes", MAX_NODES), ("links", MAX_LINKS)):
        if isinstance(data.get(key), (dict, list)) and len(data[key]) > limit:
            raise InputError(smap.where((key,)), f"{len(data[key]):,} {key}: one machine builds at most "
                             f"{limit:,} (each node is a namespace with its own kernel tables, each link a veth "
                             "pair with queues at both ends)", "build a smaller lab, e.g. fewer servers")
    try:
        topo = TopologySpec.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, smap) from None
    check_topology(topo, smap)
    return Loaded(topo, smap, text, file, template)


def input_error(exc: ValidationError, smap: SourceMap, root=None) -> InputError:
    """A pydantic error as one located InputError (file, line, key, and the field's own help)."""
    # an unknown key explains a missing one next to it ("nodez" → "nodes" missing): report it first;
    # and of a union's branches, one that took the value's type says more than one that did not
    errors = sorted(exc.errors(), key=lambda e: (e["type"] != "extra_forbidden", e["type"].endswith("_type")))
    err = errors[0]
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))  # drop union branch tags
    kind = err["type"]
    if kind == "extra_forbidden":
        parent, key = loc[:-1], loc[-1]
        allowed = _allowed_keys(parent, root)
        hint = tpl.did_you_mean(str(key), allowed)
        return InputError(smap.where(loc), f"unknown key {key!r}{hint}",
                          f"allowed keys here: {', '.join(allowed)}" if allowed else "remove it")
    if kind == "missing":
        return InputError(smap.where(loc[:-1]), f"missing required key {loc[-1]!r}",
                          _field_help(loc, root) or f"add `{loc[-1]}:`")
    msg = err["msg"]
    if kind == "value_error":  # our unit parsers: "Value error, '4x' is not a rate; ..."
        msg = msg.removeprefix("Value error, ")
    value = err.get("input")
    shown = f" (got {value!r})" if not isinstance(value, (dict, list)) else ""
    return InputError(smap.where(loc), f"{msg}{shown}", _field_help(loc, root) or f"see the format in {_format_doc(root)}")


def _format_doc(root=None) -> str:
    """Where the format of the file being read is written down."""
    name = getattr(root, "__name__", "")
    return {"Workload": "docs/traffic.md", "Experiment": "docs/experiments.md"}.get(name, "docs/lab-model.md")


def _model_at(loc: tuple, root=None):
    """The pydantic model class that a location's parent refers to, for listing allowed keys."""
    from labctl.topology import schema
    model = root or schema.TopologySpec
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            # a dict value (nodes.<name>) or list item: step into the value type
            continue
        model = _inner_model(field.annotation)
    return model


def _inner_model(annotation):
    from typing import get_args
    from pydantic import BaseModel
    stack = [annotation]
    while stack:
        a = stack.pop()
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
        stack.extend(get_args(a))
    return None


def _allowed_keys(parent: tuple, root=None) -> list[str]:
    model = _model_at(parent, root)
    return [f.alias or name for name, f in model.model_fields.items()] if model is not None else []


def _field_help(loc: tuple, root=None) -> str | None:
    model = _model_at(loc[:-1], root)
    if model is None or not isinstance(loc[-1], str):
        return None
    field = model.model_fields.get(loc[-1])
    if field is None or not field.description:
        return None
    # the field's description names what the key is; said as a sentence, then where the format is
    where = "" if "docs/" in field.description else f" (the format: {_format_doc(root)})"
    return f"{loc[-1]} is {field.description}{where}"
