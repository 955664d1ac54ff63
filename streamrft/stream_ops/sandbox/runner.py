"""The minimal runner the sandbox starts, and the parent's strict reading of what it writes.

The runner (`RUNNER`, run as `python -I -S -c RUNNER` inside the jail) waits for its job on stdin
(marshal, from the parent): the solution's code, the cases' inputs (never their expected values),
rlimits and a nonce. It imports nothing that is not already loaded or builtin (`json` alone costs
more than the interpreter's start, `signal` half of it: it builds enums; `_signal` does not; `os`
is `posix` here). Once it has the job and has set the limits, it
writes the handshake `{"ready": nonce}` as the first line
of its results descriptor (a memfd of the parent's, its number in argv); everything after that line is the solution's doing. For each case it writes one
JSON line (written by a few lines of its own, not the json module), `{"i": k, "v": <tagged value>}`
or `{"i": k, "error": "..."}`: a call's return value, or a program's stdout. Nothing the runner
writes is trusted beyond "this is the solution's answer": the runner then writes to its `done` pipe (the solution may too, early:
it loses the answers not yet written), the parent takes the results without waiting for the
jail's namespaces to be torn down, parses each line with
`json.loads` (C, bounded by the results file's size), decodes strictly (`decode_value`) and
compares with the expected value it kept.
"""
from __future__ import annotations

import json
from typing import Any

RUNNER = r"""
import _signal, io, marshal, posix as os, resource, sys
RESULTS, DONE = int(sys.argv[1]), int(sys.argv[2])
job = marshal.loads(sys.stdin.buffer.read())
for name, soft in job["rlimits"].items():  # CPU: SIGXCPU at the soft limit, SIGKILL a second later
    resource.setrlimit(getattr(resource, name), (soft, soft + 1 if name == "RLIMIT_CPU" else soft))
null = os.open("/dev/null", os.O_RDONLY); os.dup2(null, 0); os.close(null)
ESC = {i: "\\u%04x" % i for i in [*range(32), *range(0xD800, 0xE000)]}
ESC[34], ESC[92] = '\\"', "\\\\"
def js(o):  # JSON without the json module: str, bool, int, None, list and str-keyed dict
    t = type(o)
    if t is str: return '"' + o.translate(ESC) + '"'
    if t is bool: return "true" if o else "false"
    if t is int: return str(o)
    if o is None: return "null"
    if t is list: return "[" + ",".join([js(x) for x in o]) + "]"
    if t is dict: return "{" + ",".join([js(k) + ":" + js(v) for k, v in o.items()]) + "}"
    raise TypeError(t.__name__)
def emit(obj):
    data = (js(obj) + "\n").encode()
    while data:
        data = data[os.write(RESULTS, data):]
emit({"ready": job["nonce"]})
current = [-1]
def out_of_cpu(signum, frame):
    emit({"i": current[0], "error": "CPU time limit of %d s exceeded" % job["rlimits"]["RLIMIT_CPU"]}); finish()
_signal.signal(_signal.SIGXCPU, out_of_cpu)
def enc(v, depth=0):
    if depth > 64:
        raise ValueError("the value is nested deeper than 64 levels")
    t = type(v)
    if v is None: return ["n"]
    if t is bool: return ["b", v]
    if t is int: return ["i", str(v)]
    if t is float: return ["f", repr(v)]
    if t is str: return ["s", v]
    if t is bytes: return ["y", v.hex()]
    if t is list: return ["l", [enc(x, depth + 1) for x in v]]
    if t is tuple: return ["t", [enc(x, depth + 1) for x in v]]
    if t is set: return ["e", [enc(x, depth + 1) for x in v]]
    if t is frozenset: return ["z", [enc(x, depth + 1) for x in v]]
    if t is dict: return ["d", [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]]
    raise TypeError("the call returned a %s, not a plain value (None, bool, int, float, str, bytes, list, tuple, set, dict)" % t.__name__)
def finish():
    try:
        os.write(DONE, b"done")
    finally:
        os._exit(0)
def error(e):
    return "%s: %s" % (type(e).__name__, str(e)[-400:])
code, cases, cap = job["code"], job["cases"], job["output_cap"]
g = {"__name__": "__main__"}
if any("call" in c for c in cases):
    current[0] = -1
    try:
        exec(compile(code, "solution.py", "exec"), g)
    except BaseException as e:
        emit({"i": -1, "error": "the solution raised " + error(e)}); finish()
for i, case in enumerate(cases):
    current[0] = job["first"] + i
    if "call" in case:
        try:
            out = {"i": current[0], "v": enc(eval(compile(case["call"], "test_%d" % current[0], "eval"), g))}
        except BaseException as e:
            out = {"i": current[0], "error": error(e)}
        emit(out)
        continue
    sys.stdout.flush()
    saved = os.dup(1)
    fin, fout = os.memfd_create("stdin"), os.memfd_create("stdout")
    os.write(fin, case["stdin"].encode()); os.lseek(fin, 0, 0)
    os.dup2(fin, 0); os.dup2(fout, 1); os.close(fin)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    status = None
    try:
        exec(compile(code, "solution.py", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        status = None if e.code in (None, 0) else "the program exited with status %r" % (e.code,)
    except BaseException as e:
        status = "the program raised " + error(e)
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    os.dup2(saved, 1); os.close(saved)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    os.lseek(fout, 0, 0); text = os.read(fout, cap); os.close(fout)
    emit({"i": current[0], "error": status} if status else {"i": current[0], "v": ["s", text.decode("utf-8", "replace")]})
sys.stdout.flush()
finish()
"""

MAX_DEPTH = 64
MAX_ITEMS = 1_000_000


class ValueFormatError(ValueError):
    """What the sandbox wrote is not a value of the runner's format."""


def decode_value(tagged: Any) -> Any:
    """A tagged value back into plain Python values (never an object with behaviour of its own)."""
    budget = [MAX_ITEMS]

    def dec(t: Any, depth: int) -> Any:
        budget[0] -= 1
        if depth > MAX_DEPTH or budget[0] < 0:
            raise ValueFormatError("the value is too deep or too large")
        if not isinstance(t, list) or not t or not isinstance(t[0], str):
            raise ValueFormatError("not a tagged value")
        tag, rest = t[0], t[1:]
        if tag == "n" and not rest:
            return None
        if len(rest) != 1:
            raise ValueFormatError(f"tag {tag[:8]!r} takes one payload")
        p = rest[0]
        if tag == "b" and isinstance(p, bool):
            return p
        if tag == "i" and isinstance(p, str):
            return int(p)  # Python's own limit on digits applies
        if tag == "f" and isinstance(p, str):
            return float(p)
        if tag == "s" and isinstance(p, str):
            return p
        if tag == "y" and isinstance(p, str):
            return bytes.fromhex(p)
        if tag in ("l", "t", "e", "z") and isinstance(p, list):
            return {"l": list, "t": tuple, "e": set, "z": frozenset}[tag](dec(x, depth + 1) for x in p)
        if tag == "d" and isinstance(p, list):
            out = {}
            for pair in p:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise ValueFormatError("a dict item is a [key, value] pair")
                out[dec(pair[0], depth + 1)] = dec(pair[1], depth + 1)
            return out
        raise ValueFormatError(f"unknown tag {tag[:8]!r} or payload")

    try:
        return dec(tagged, 0)
    except ValueFormatError:
        raise
    except (TypeError, ValueError, OverflowError, RecursionError) as e:  # an unhashable key, 5,000 digits
        raise ValueFormatError(f"{type(e).__name__}: {e}") from None


def _line(raw: bytes):
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def read_lines(data: bytes, nonce: str, total: int, first: int = 0) -> tuple[bool, dict[int, dict]]:
    """(handshake seen, the first line the sandbox wrote for each case index) from the results descriptor's bytes."""
    lines = data.split(b"\n")
    if _line(lines[0]) != {"ready": nonce}:
        return False, {}
    out: dict[int, dict] = {}
    for raw in lines[1:]:
        if not raw.strip():
            continue
        line = _line(raw)
        if not isinstance(line, dict) or type(line.get("i")) is not int:
            continue
        i = line["i"]
        if i == -1 or first <= i < first + total:
            out.setdefault(i, line)
    return True, out
