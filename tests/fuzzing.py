"""How the loader fuzz damages an input (tests/test_loader_fuzz.py): hostile values anywhere,
plausible values of the right type, character damage and YAML's own hostile forms, each a
hypothesis strategy seeded from its draw; and `within`, which turns a hang into a failure."""
from __future__ import annotations

import contextlib
import copy
import re
import signal

from hypothesis import strategies as st

HANG_S = 5
# a blocked read never returns, so the wall-clock bound only needs to be finite: on a machine
# shared with a second test worker, a 5 s CPU build once took more than 5 s of wall time
HANG_WALL_S = 60


@contextlib.contextmanager
def within(seconds: int = HANG_S, wall: int = HANG_WALL_S):
    """Fail a case that spends more than `seconds` of CPU loading or refusing one input (a loop), or
    more than `wall` seconds of wall time (a read that blocks: a FIFO, a device): a hang is a defect
    like a traceback."""
    def hung(signum, frame):
        what = f"{seconds} s of CPU" if signum == signal.SIGPROF else f"{wall} s (wall clock: blocked?)"
        raise AssertionError(f"an input took more than {what} to load or refuse")
    old = signal.signal(signal.SIGPROF, hung), signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, wall)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, old[0])
        signal.signal(signal.SIGALRM, old[1])


# values a careless or hostile file might hold where something else belongs
NASTY = [None, True, 0, -1, 2**64, 10**400, 1e308, float("inf"), float("-inf"), float("nan"), "", "..",
         "../../etc", "/", "1e999G", ".inf", "0x10", "400G", "9000", "-5ms", "1e15s", "{{ 7*7 }}", "a: b",
         "- x", "*x", "&x", "{{ cycler.__init__.__globals__ }}", "10.0.0.0/32", "127.0.0.0/8", "224.0.0.0/4",
         "😀", "x" * 300, "leaf1", "srv1-gpu0:nic0", "backend", "gpu", "switch", [], {}, [1, [2, [3]]],
         {"k": {"k": {"k": 1}}}, ["a", "b", "c"], 1e30, "NaN", "/var/run/docker.sock:/s", "/:/host",
         "/dev/zero", "/dev/stdin", "/proc/self/mem", "../../../../dev/zero"]


def _paths(doc, prefix=()):
    """Every (path, value) in a nested document."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


def _set(doc, path, value):
    if not path:
        return value
    cur = doc
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return doc


@st.composite
def mutated(draw, data: dict):
    """`data` with a few values replaced, keys removed or added, anywhere in it with equal chance
    (hypothesis's own choices lean towards the first few; a seeded Random does not)."""
    rnd = draw(st.randoms(use_true_random=False))
    doc = copy.deepcopy(data)
    for _ in range(rnd.randint(1, 3)):
        path, value = rnd.choice(list(_paths(doc)))
        action = rnd.choice(["replace", "replace", "delete", "add"])
        nasty = copy.deepcopy(rnd.choice(NASTY))         # never one object in two places
        if action == "replace" or not path:
            doc = _set(doc, path, nasty)
        elif action == "delete":
            parent = doc
            for p in path[:-1]:
                parent = parent[p]
            del parent[path[-1]]
        elif isinstance(value, dict):
            value[rnd.choice(["name", "kind", "rate", "zzz", "template", "vars", "links", "rank"])] = nasty
        elif isinstance(value, list):
            value.append(nasty)
        else:
            doc = _set(doc, path, nasty)
    return doc


@st.composite
def text_mutated(draw, text: str):
    """Character-level damage: a character deleted, inserted or doubled."""
    rnd = draw(st.randoms(use_true_random=False))
    chars = list(text)
    for _ in range(rnd.randint(1, 4)):
        i = rnd.randrange(max(1, len(chars)))
        op = rnd.choice(["del", "ins", "dup"])
        if op == "del" and chars:
            del chars[i]
        elif op == "ins":
            chars.insert(i, rnd.choice(list(":-[]{}&*!|>'\"#%@`\t\n ,?\\\xff")))
        elif chars:
            chars.insert(i, chars[i])
    return "".join(chars)


def _words(doc) -> list[str]:
    """Every string of a document, values and keys: names a plausible mutation moves elsewhere."""
    out = {v for _, v in _paths(doc) if isinstance(v, str)}
    out |= {k for p, _ in _paths(doc) for k in p if isinstance(k, str)}
    return sorted(out)


@st.composite
def plausible(draw, data: dict):
    """`data` with one to three values replaced by ones of the same type: numbers at their edges,
    names taken from elsewhere in the document, lists shortened, repeated or emptied, keys dropped
    or renamed. Unlike `mutated`, most of these pass the schema and reach the checks behind it."""
    rnd = draw(st.randoms(use_true_random=False))
    doc = copy.deepcopy(data)
    words = _words(doc)
    for _ in range(rnd.randint(1, 3)):
        path, v = rnd.choice(list(_paths(doc)))
        if not path:
            continue
        if isinstance(v, bool):
            new = not v
        elif isinstance(v, int):
            new = rnd.choice([0, 1, -1, v + 1, v * 1000, v // 1000, 2**31, 2**63, 10**30])
        elif isinstance(v, float):
            new = rnd.choice([0.0, -v, v * 1e6, v / 1e6, float("nan"), float("inf"), 1e-300])
        elif isinstance(v, str):
            new = rnd.choice([rnd.choice(words), rnd.choice(words), v + "x", v[:-1], "", v.upper(), v + "-2",
                              "0", v * 2, v.replace("G", "T"), v.replace("ms", "us"), v.replace("MB", "GB")])
        elif isinstance(v, list) and v:
            new = list(v)
            op = rnd.choice(["drop", "repeat", "reverse", "empty"])
            if op == "drop":
                new.pop(rnd.randrange(len(new)))
            elif op == "repeat":
                new.append(copy.deepcopy(rnd.choice(new)))
            elif op == "reverse":
                new.reverse()
            else:
                new = []
        elif isinstance(v, dict) and v:
            new = dict(v)
            key = rnd.choice(list(new))
            if rnd.random() < 0.5:
                del new[key]
            else:
                new[rnd.choice(words)] = copy.deepcopy(new[key])
        else:
            continue
        _set(doc, path, new)
    return doc


# YAML's own hostile forms: what a safe_dump of a mutated document never writes
TOKENS = ["!!python/name:os.system", "!!python/object/apply:os.system ['true']", "!!binary aGVsbG8=",
          "0x" + "f" * 4000, "0b" + "1" * 15000, "1:" * 3000 + "1", "9" * 5000, "0o" + "7" * 5000,
          "2020-13-45", "2001-12-14t21:59:43.10-99:00", "2020-02-30", ".nan", "-.inf", "*undefined",
          "&a [*a, *a]", "!!set {a, b}", "!!omap [{a: 1}]", "!custom x", "!!int x", "!!float x",
          "!!timestamp x", "!!str", "~", "{<<: {a: 1}}", "[" * 100 + "]" * 100, "{a: " * 80 + "1" + "}" * 80,
          "'\\x00'", "\"\\u0000\"", "? [a]\n  : b", "|\n  x", "!!null x", "1e400", "-0", "0.0.0"]
MERGE_LINES = ["<<: {name: x}", "<<: *undefined", "? !!python/name:os.system\n: 1"]


@st.composite
def token_mutated(draw, text: str):
    """One to three values of the file's `key: value` lines replaced by a hostile YAML form, or a
    merge key inserted as a line of its own."""
    rnd = draw(st.randoms(use_true_random=False))
    lines = text.split("\n")
    spots = [i for i, line in enumerate(lines) if re.match(r"^\s*(- )?[\w.-]+: \S", line)]
    for _ in range(rnd.randint(1, 3)):
        if not spots:
            break
        i = rnd.choice(spots)
        if rnd.random() < 0.2:
            indent = re.match(r"^\s*", lines[i]).group(0)
            lines.insert(i, indent + rnd.choice(MERGE_LINES))
            spots = [j + (j >= i) for j in spots]
        else:
            key = lines[i].split(": ", 1)[0]
            lines[i] = f"{key}: {rnd.choice(TOKENS)}"
    return "\n".join(lines)


def edges(spec: dict) -> list:
    """A template variable's edge values: its bounds and one past them, the other truth value and
    choices, and what no variable should take."""
    out = [0, -1, float("nan"), float("inf"), "", "nan", "1e999G", "-5ms", "0", None, [], {}]
    for bound in ("min", "max"):
        if isinstance(spec.get(bound), (int, float)):
            b = spec[bound]
            out += [b, b - 1, b + 1, b * 2, b - 0.5, -b]
    out += list(spec.get("choices") or []) + ["zzz"]
    if spec.get("type") in ("rate", "size", "duration"):
        out += ["400G", "1Tbit", "64MB", "1e15s", "0.0001ms", "5 parsecs", "-1G", "NaNG", "infG"]
    return out
