"""The llama-server command line, built from small pure functions.

A flag is a (name, value) pair; value None is a bare switch. The recipe gives an ordered list,
the user overrides it (extra args after `--`) or drops entries (`--drop FLAG`), and buun adds
what it must know itself: -m, -md, --host, --port, --rpc and --metrics, and --alias (the recipe's name)
unless the user gives one. Flags are compared by their
canonical spelling, so `-c 4096` replaces a recipe's `--ctx-size`, and `--no-X` replaces `--X`.
Secrets never enter the argv, from the command line or from a recipe alike: the API key goes to
llama-server through LLAMA_API_KEY and a Hub token through HF_TOKEN (llama-server's own variables
for them), so neither is visible in `ps`, in the state or spec file, in logs or in --print-cmd.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from buun_tool.base.errors import UsageError

Flag = tuple[str, str | None]

# Spellings of one llama-server option; the first is the canonical one. Upstream's names and the
# fork's (which the recipe uses) are listed together, so an override in either spelling replaces
# the recipe's flag, before and after the compatibility patch.
ALIAS_GROUPS: tuple[tuple[str, ...], ...] = (
    ("-m", "--model"),
    ("-md", "--model-draft", "--spec-draft-model"),
    ("-c", "--ctx-size"),
    ("-cd", "--ctx-size-draft", "--spec-draft-ctx-size"),
    ("-ngl", "--gpu-layers", "--n-gpu-layers"),
    ("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl"),
    ("-np", "--parallel"),
    ("-fa", "--flash-attn"),
    ("-b", "--batch-size"),
    ("-ub", "--ubatch-size"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-ctkd", "--cache-type-k-draft", "--spec-draft-type-k"),
    ("-ctvd", "--cache-type-v-draft", "--spec-draft-type-v"),
    ("-t", "--threads"),
    ("-tb", "--threads-batch"),
    ("-td", "--threads-draft", "--spec-draft-threads"),
    ("-tbd", "--threads-batch-draft", "--spec-draft-threads-batch"),
    ("--draft-max", "--draft", "--draft-n", "--spec-draft-n-max"),
    ("--draft-min", "--draft-n-min", "--spec-draft-n-min"),
    ("--draft-p-min", "--spec-draft-p-min"),
    ("-dev", "--device"),
    ("-devd", "--device-draft", "--spec-draft-device"),
    ("-ts", "--tensor-split"),
    ("-sm", "--split-mode"),
    ("-mg", "--main-gpu"),
    ("-ot", "--override-tensor"),
    ("-otd", "--override-tensor-draft", "--spec-draft-override-tensor"),
    ("-a", "--alias"),
    ("-to", "--timeout"),
    ("-n", "--predict", "--n-predict"),
    ("-s", "--seed"),
    ("--temp", "--temperature"),
    ("-kvu", "--kv-unified"),
    ("-kvo", "--kv-offload"),
    ("-cb", "--cont-batching"),
    ("-cram", "--cache-ram"),
    ("-v", "--verbose", "--log-verbose"),
    ("-lv", "--verbosity", "--log-verbosity"),
    ("--ui", "--webui"),
    ("-hft", "--hf-token"),
    ("-bs", "--backend-sampling"),
    ("--spec-tree-budget", "--tree-budget", "--ddtree-budget"),
)
# Negative switches whose spelling is not simply --no-<positive>.
NEGATIONS: Mapping[str, str] = {
    "-nkvo": "-kvo", "-nocb": "-cb", "-no-kvu": "-kvu", "--no-webui": "--ui",
}
_CANONICAL = {spelling: group[0] for group in ALIAS_GROUPS for spelling in group}
# the tree's flags (patch 0023), by canonical spelling
TREE_BUDGET = "--spec-tree-budget"
TREE_K = "--spec-tree-k"

# Flags buun sets itself: the supervisor must know the address it probes and the files it checks.
MANAGED = {"-m": "--model", "-md": "--draft", "--host": "--host", "--port": "--port",
           "--rpc": "--rpc"}  # the workers: checked before a launch, watched while it runs
ALWAYS_ON = ("--metrics",)  # `buun status` reads /metrics
# Flags whose value is a secret (by canonical spelling), and the variable llama-server reads it from.
SECRET_ENV: Mapping[str, str] = {"--api-key": "LLAMA_API_KEY", "-hft": "HF_TOKEN"}
SECRET_FLAGS = tuple(SECRET_ENV)
MASK = "****"
API_KEY_ENV = SECRET_ENV["--api-key"]


def canonical(flag: str) -> str:
    """The one spelling an option is compared by: `--ctx-size` -> `-c`, `--no-mmap` -> `--mmap`."""
    if flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")  # llama-server accepts both in long flags
    if flag in NEGATIONS:
        return _CANONICAL.get(NEGATIONS[flag], NEGATIONS[flag])
    if flag.startswith("--no-") and flag not in _CANONICAL:
        positive = "--" + flag[5:]
        return _CANONICAL.get(positive, positive)
    return _CANONICAL.get(flag, flag)


def _negative(flag: str) -> bool:
    return flag in NEGATIONS or (flag.startswith("--no-") and flag not in _CANONICAL)


def option(flags: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """The value given for an option in any of its spellings (`option(f, "-c")` finds
    `--ctx-size`), the last one given winning; `default` when it is not there."""
    key = canonical(name)
    found = [v for n, v in flags.items() if canonical(n) == key and not _negative(n)]
    return found[-1] if found else default


def take_models(flags: Sequence[Flag]) -> tuple[str, str | None, list[Flag]]:
    """(target, drafter or None, the other flags) of a raw argument list that names its models
    with -m / -md in any spelling (the tests' harness does), for server_argv."""
    models = {canonical(n): v for n, v in flags if canonical(n) in ("-m", "-md")}
    if not models.get("-m"):
        raise UsageError("the llama-server arguments name no model", "pass -m TARGET.gguf")
    return models["-m"], models.get("-md"), [f for f in flags if canonical(f[0]) not in ("-m", "-md")]


def is_count(text: str) -> bool:
    """ASCII digits only: a count int() reads (str.isdigit() also holds for '²', which int() refuses)."""
    return text.isascii() and text.isdigit()


def looks_like_flag(token: str) -> bool:
    """A word llama-server reads as an option, not a value: `-c`, `--jinja`, not `-1` or `-0.5`."""
    return token.startswith("-") and not re.fullmatch(r"-\d[\d.eE+-]*", token)


def parse_args(args: Sequence[str]) -> list[Flag]:
    """Extra args (`-c 4096 --jinja --spec-type=draft-dflash`) as flags: a token that is not a flag
    is the value of the one before it; `--flag=value` and `-f=value` are split (llama-server wants
    them apart, and `-hft=TOKEN` whole was no secret flag: it was saved and shown as it was)."""
    flags: list[Flag] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not looks_like_flag(token):
            raise UsageError(f"unexpected argument {token!r} for llama-server",
                             "extra llama-server arguments are flags, each followed by its value if it takes one")
        if "=" in token:
            name, value = token.split("=", 1)
            flags.append((name, value))
            i += 1
        elif i + 1 < len(args) and not looks_like_flag(args[i + 1]):
            flags.append((token, args[i + 1]))
            i += 2
        else:
            flags.append((token, None))
            i += 1
    return flags


def recipe_flags(server_flags: Mapping[str, Any]) -> list[Flag]:
    """A recipe's `server.flags` mapping in order: `true` is a bare switch, `false` leaves it out."""
    out: list[Flag] = []
    for name, value in server_flags.items():
        if value is True:
            out.append((name, None))
        elif value is not False and value is not None:
            out.append((name, str(value)))
    return out


def merge(base: Sequence[Flag], overrides: Sequence[Flag], drops: Iterable[str] = ()) -> list[Flag]:
    """Recipe flags with the user's changes: a dropped flag goes; an override takes the place of
    the recipe's flag of the same option (all its spellings); new flags come last, in order."""
    dropped = {canonical(d) for d in drops}
    overridden = {canonical(name) for name, _ in overrides}
    placed: set[str] = set()
    out: list[Flag] = []
    for name, value in base:
        key = canonical(name)
        if key in overridden:
            if key not in placed:
                out.extend(f for f in overrides if canonical(f[0]) == key)
                placed.add(key)
        elif key not in dropped:
            out.append((name, value))
    out.extend(f for f in overrides if canonical(f[0]) not in placed)
    return out


def check_unmanaged(flags: Sequence[Flag], source: str) -> None:
    """Refuse flags buun sets itself; say which buun option to use instead."""
    for name, _ in flags:
        key = canonical(name)
        if key in MANAGED:
            raise UsageError(f"{name} (in {source}) is set by buun itself",
                             f"use `buun serve {MANAGED[key]} ...` instead")


def check_drops(drops: Iterable[str]) -> None:
    for d in drops:
        if not d.startswith("-"):
            raise UsageError(f"--drop {d!r}: expected a llama-server flag such as -cd or --draft-max")
        if canonical(d) in ALWAYS_ON or canonical(d) in MANAGED:
            raise UsageError(f"--drop {d}: buun always sets it", "buun status reads /metrics; "
                             "-m, -md, --host, --port and --rpc come from buun's own options")


def take_secrets(flags: Sequence[Flag]) -> tuple[list[Flag], dict[str, str]]:
    """Pull every secret flag out of the flags: (the rest, {canonical flag: value}). Their values
    reach llama-server through the environment instead (SECRET_ENV); the last one given wins."""
    secrets: dict[str, str] = {}
    rest: list[Flag] = []
    for name, value in flags:
        key = canonical(name)
        if key not in SECRET_ENV:
            rest.append((name, value))
        elif value is None:
            raise UsageError(f"{name} needs a value", f"{name} VALUE (or leave the flag out)")
        else:
            secrets[key] = value
    return rest, secrets


def server_argv(binary: str, target: str, draft: str | None, host: str, port: int, flags: Sequence[Flag],
                alias: str | None = None) -> list[str]:
    """The full argv of every llama-server buun runs (serve, bench, fit --measure, the tests):
    models first (no -md without a drafter), then the recipe/user flags, then the model's name
    (`alias`, unless the flags name it), the address and --metrics."""
    argv = [binary, "-m", target, *(["-md", draft] if draft is not None else [])]
    for name, value in flags:
        argv += [name] if value is None else [name, value]
    if alias and not any(canonical(name) == "-a" for name, _ in flags):
        argv += ["--alias", alias]  # what /v1/models and responses call the model, not the GGUF's path
    argv += ["--host", host, "--port", str(port)]
    argv += [f for f in ALWAYS_ON if f not in argv]
    return argv


def mask(argv: Sequence[str]) -> list[str]:
    """argv with the value of every secret flag replaced, for display and for the state file."""
    out = list(argv)
    for i, token in enumerate(out[:-1]):
        if canonical(token) in SECRET_FLAGS:
            out[i + 1] = MASK
    return out


def display(argv: Sequence[str], api_key: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The command a user could paste, secrets masked, after the variables it needs (`env`: the cards)."""
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    prefix += f"{API_KEY_ENV}={MASK} " if api_key else ""
    return prefix + shlex.join(mask(argv))


KEY_FILE = "--api-key-file"
_GIVEN_KEY = "the API key given (--api-key, BUUN_API_KEY, or --api-key in the recipe or after `--`)"
_KEY_HINT = "use a key of letters, digits and '-' or '_' (`openssl rand -hex 32` makes one)"


def csv_keys(value: str) -> list[str]:
    """The API keys llama-server reads from one --api-key value (LLAMA_API_KEY, which buun hands it),
    as its common/arg.cpp does: a row of comma-separated fields, where a field that starts with '"'
    runs to the next lone '"' and may hold commas ('""' in it is one '"'); the empty fields are
    dropped. So `,` or `""` is no key at all, and llama-server runs without one."""
    fields: list[str] = []
    field, quoted, i = "", False, 0
    while i < len(value):
        ch = value[i]
        if ch == '"' and not quoted and not field:
            quoted = True
        elif ch == '"' and quoted and value[i + 1:i + 2] == '"':
            field += '"'
            i += 1
        elif ch == '"' and quoted:
            quoted = False
        elif ch == "," and not quoted:
            fields.append(field)
            field = ""
        else:
            field += ch
        i += 1
    fields.append(field)
    return [f for f in fields if f]


def file_keys(text: str) -> list[tuple[int, str]]:
    """(line number, key) of each key llama-server reads from an --api-key-file: every line, as it
    is, but the empty ones and those starting with '#'."""
    return [(n, line) for n, line in enumerate(text.split("\n"), 1) if line and not line.startswith("#")]


def unsendable(key: str) -> str | None:
    """Why no client can send `key` (None when one can): HTTP drops the spaces and tabs at the end of
    a header's value (a key of only those is none at all) and refuses its control characters, so
    llama-server would answer every request 401."""
    if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", key):
        return "it holds a control character" + (" (a Windows line end?)" if key.endswith("\r") else "")
    if key.strip(" \t") == "":
        return "it is only white space"
    if key.endswith((" ", "\t")):
        return "it ends in white space, which HTTP drops from a header"
    return None


def api_keys(flags: Sequence[Flag], api_key: str | None) -> list[str]:
    """The keys llama-server will take, as it reads them: `api_key` (or else the last --api-key among
    `flags`, as spec.resolve hands it on) split as csv_keys does, and the lines of each
    --api-key-file. A value or file that gives no key, or a key no client can send, is a usage
    error (the server would run without a key, or refuse everyone); the key itself is never shown."""
    given = api_key or next((v for n, v in reversed(flags) if canonical(n) == "--api-key" and v), None)
    keys: list[str] = []
    if given:
        found = csv_keys(given)
        if not found:
            raise UsageError(f"{_GIVEN_KEY} holds no key: llama-server splits it at commas and drops the "
                             "empty parts, and would serve without a key", _KEY_HINT)
        for i, key in enumerate(found, 1):
            if why := unsendable(key):
                part = f"its part {i} of {len(found)} (split at commas)" if len(found) > 1 else "it"
                raise UsageError(f"{_GIVEN_KEY}: no client can send {part}: {why}", _KEY_HINT)
        keys += found
    for name, path in flags:
        if canonical(name) != KEY_FILE:
            continue
        if not path:
            raise UsageError(f"{name} needs a value", f"{name} FILE: a file with one API key a line")
        try:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", "surrogateescape")
        except OSError as exc:
            raise UsageError(f"{name} {path}: cannot read it: {exc.strerror}",
                             "give the file that holds the API key, one a line") from None
        found_lines = file_keys(text)
        if not found_lines:
            raise UsageError(f"{name} {path} holds no key: llama-server skips its empty lines and those "
                             "starting with '#', and would serve without a key",
                             f"write the key on a line of its own; {_KEY_HINT}")
        for line, key in found_lines:
            if why := unsendable(key):
                raise UsageError(f"{name} {path}: no client can send the key of line {line}: {why}",
                                 f"write each key on a line of its own, with nothing around it; {_KEY_HINT}")
        keys += [k for _, k in found_lines]
    return keys


def has_auth(flags: Sequence[Flag], api_key: str | None) -> bool:
    """Whether llama-server will ask for a key (api_keys: an unusable one is an error)."""
    return bool(api_keys(flags, api_key))


def check_exposure(host: str, flags: Sequence[Flag], api_key: str | None, no_api_key: bool) -> None:
    """Refuse an API key llama-server would read as none or that no client can send (api_keys), on
    any host; and to serve beyond loopback without a key, unless the user said so (--no-api-key):
    anyone who can reach the port could use the server."""
    if has_auth(flags, api_key) or no_api_key or is_loopback(host):
        return
    raise UsageError(f"--host {host} lets other machines reach this server and no API key is set",
                     "pass --api-key KEY (or set BUUN_API_KEY, or `-- --api-key-file FILE`); to serve "
                     "without a key on purpose, pass --no-api-key")


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (a UNIX socket path counts)."""
    if host.endswith(".sock") or host == "localhost":
        return True
    try:
        return all(ipaddress.ip_address(h.strip()).is_loopback for h in host.split(","))
    except ValueError:
        return False


def probe_host(host: str) -> str:
    """Where to reach a server bound to `host` from this machine (a wildcard bind is reached on loopback)."""
    first = host.split(",")[0].strip()
    if first in ("0.0.0.0", ""):
        return "127.0.0.1"
    if first == "::":
        return "::1"
    return first


def base_url(host: str, port: int) -> str:
    h = probe_host(host)
    return f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}"
