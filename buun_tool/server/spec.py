"""One launch of a server: which recipe, models, binary, address and flags, and the rules the
supervisor follows. Saved as spec.json in the instance folder, so a detached supervisor and
`buun restart` run exactly what `buun start` resolved. No secret is part of it.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from buun_tool.base import command, console, nvidia, paths
from buun_tool.base import tree_budget as budgets
from buun_tool.base.command import Flag
from buun_tool.base.errors import BuunError, NotReadyError, UsageError
from buun_tool.formats import gguf_tools, layout, recipes
from buun_tool.pipeline import build, convert, patches
from buun_tool.plan import context, devices, fit
from buun_tool.server import addresses, rpc

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
API_KEY_ENV = "BUUN_API_KEY"  # where buun itself takes the key from (besides --api-key)


def default_paths(recipe: recipes.Recipe, models_dir: Path) -> tuple[Path, Path]:
    """Where the model pipeline puts the (target, drafter) GGUFs of `recipe`, made yet or not."""
    lay = layout.for_recipe(recipe, models_dir)
    return lay.target_gguf, lay.drafter_gguf()


def default_models(recipe: recipes.Recipe, models_dir: Path) -> tuple[Path, Path]:
    """The (target, drafter) GGUFs the model pipeline made for `recipe` in `models_dir`."""
    target = default_paths(recipe, models_dir)[0]
    if not target.is_file():
        raise NotReadyError(f"the target model of {recipe.name} is not downloaded ({target})",
                            f"run `buun pull {recipe.ref}` into this folder, pass --models-dir with the folder it "
                            "went to, or --model TARGET.gguf --draft DRAFT.gguf")
    return target, convert.require_converted(recipe, models_dir)


@dataclass
class Policy:
    """How the supervisor judges and restarts the server (all times in seconds)."""

    ready_timeout: float = 180.0  # no load progress for this long while starting: give up on this launch
    health_interval: float = 10.0  # /health probes while ready
    health_timeout: float = 5.0
    health_failures: int = 3  # consecutive failed probes that make a server "hung"
    max_crashes: int = 5  # this many crashes ...
    crash_window: float = 300.0  # ... within this window: stop restarting
    backoff_initial: float = 1.0  # wait before the first relaunch, doubled per recent crash
    backoff_max: float = 60.0
    stop_timeout: float = 15.0  # grace between SIGTERM and SIGKILL
    log_max_bytes: int = 10 * 2**20
    log_keep: int = 3
    # With RPC workers: a busy slot without progress this long, /health answering, is a worker that
    # stopped answering without closing its connection (frozen, or its network gone): hung. 0: off.
    stall_timeout: float = 120.0

    def backoff(self, recent_crashes: int) -> float:
        return min(self.backoff_initial * 2 ** max(recent_crashes - 1, 0), self.backoff_max)

    def validate(self) -> Policy:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise UsageError(f"--{f.name.replace('_', '-')} must not be negative")
        if self.max_crashes < 1 or self.health_failures < 1:
            raise UsageError("--max-crashes and --health-failures must be at least 1")
        return self


@dataclass
class LaunchSpec:
    name: str
    recipe: str
    recipe_source: str  # the recipe file, absolute: `buun restart --models-dir` loads it again from anywhere
    binary: str
    target: str
    draft: str
    host: str
    port: int
    flags: list[Flag]
    recipe_flags: list[str]  # flag names the recipe set (for error hints)
    policy: Policy = field(default_factory=Policy)
    no_api_key: bool = False  # the user said to serve beyond loopback without a key (--no-api-key)
    keyed: bool = False  # launched with an API key, which is never saved: a restart must be given it again
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    context: dict[str, Any] | None = None  # context.ContextChoice: the -c given and why
    # the models folder target and draft come from; None when either was given by path (--model, --draft)
    models_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # llama-server's own variables: the cards (devices.py)
    placement: dict[str, Any] | None = None  # --gpus: the cards and the split (devices.with_split)
    rpc: list[str] = field(default_factory=list)  # RPC workers (--rpc), in llama-server's order
    # where the parts run with workers: the devices llama-server splits the target over, in order
    # ({"name": "RPC0", "where": "10.0.0.5:50052"}), and the one that holds the drafter (-devd)
    rpc_devices: list[dict[str, str]] = field(default_factory=list)
    draft_device: str | None = None
    draft_device_why: str = ""

    @property
    def argv(self) -> list[str]:
        return command.server_argv(self.binary, self.target, self.draft, self.host, self.port, self.flags,
                                   alias=self.recipe)

    @property
    def url(self) -> str:
        return command.base_url(self.host, self.port)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["flags"] = [list(f) for f in self.flags]
        return d

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchSpec:
        d = dict(data)
        d["flags"] = [(str(n), None if v is None else str(v)) for n, v in d["flags"]]
        d["policy"] = Policy(**d.get("policy", {}))
        return cls(**d)

    def missing_files(self) -> list[BuunError]:
        """What `serve` needs on disk and does not find, each with what to run."""
        missing: list[BuunError] = []
        if not Path(self.binary).is_file():
            missing.append(NotReadyError(f"llama-server is not built yet: {self.binary} does not exist",
                                         "run `buun build` (or `buun setup`, which builds it)"))
        for role, path, fix, option in (("target model", self.target, "buun pull", "--model"),
                                        ("drafter", self.draft, "buun convert", "--draft")):
            problem = gguf_tools.not_a_file(Path(path), f"the {role} {path}", option)
            if problem:
                missing.append(problem)
            elif not Path(path).is_file():
                missing.append(NotReadyError(
                    f"the {role} {path} does not exist", f"run `{fix} {recipes.reference(Path(self.recipe_source))}` "
                    "(or `buun setup`), or pass "
                    f"{option} with the path of an existing GGUF"))
        return missing

    def check_files(self) -> None:
        """What `serve` needs on disk before launching (--print-cmd does not)."""
        for problem in self.missing_files():
            raise problem


def resolve(recipe_ref: str | None, *, models_dir: Path, name: str | None = None, model: Path | None = None,
            draft: Path | None = None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
            extra: list[str] | None = None, drops: list[str] | None = None, api_key: str | None = None,
            no_api_key: bool = False, policy: Policy | None = None,
            need_models: bool = True, tree_budget: int | None = None,
            slots: int | None = None, gpus: tuple[int, ...] | None = None,
            draft_gpu: int | None = None, workers: str | None = None,
            cpu_build: bool | None = None) -> tuple[LaunchSpec, str | None]:
    """A launch spec from a recipe and the command-line options; also the API key to give
    llama-server (`api_key`, which the CLI fills from --api-key or BUUN_API_KEY, else an
    `--api-key` after `--` or in the recipe). No secret flag stays in the spec's flags (see
    command.SECRET_ENV). The target and draft not given by path are the recipe's in `models_dir`;
    without `need_models` they may still be missing (--print-cmd). `tree_budget` (--tree-budget)
    replaces the recipe's server.tree.budget (with_tree), `slots` (--slots) its server.slots
    (with_slots), `gpus` (--gpus) its server.gpus, with the drafter on `draft_gpu` (devices.py).
    `workers` (--rpc) are RPC workers: each must answer now (unless `need_models` is off), and the
    drafter goes where the target's last layers are (with_workers). `cpu_build` says whether the
    server will be a CPU build's where the caller knows better than the binary found now (setup's
    dry-run: the build its build stage will make)."""
    from buun_tool.server.instance import check_name

    patches.rollback_from_env()  # llama-server would take a misspelt value for the tape without a word
    recipe = recipes.load(recipe_ref)
    binary, planned = server_binary(built=need_models)
    where = devices.placement(recipe, gpus, draft_gpu, binary)
    endpoints = addresses.parse(workers) if workers else []
    check_one_split(endpoints, where)
    if cpu_build is None:
        cpu_build = (planned or build.variant_of(binary)) == "cpu"
    resolved = launch_flags(recipe, command.parse_args(extra or []), drops or [], "the arguments after `--`",
                            models_dir, tree_budget, slots, where, endpoints, cpu_build=cpu_build)
    flags, secrets, context = resolved.flags, resolved.secrets, resolved.context
    # llama-server opens a key file from its own folder (buun's, when detached), and check_exposure
    # judges the keys in it from this one: the same file for both, and for a restart from elsewhere
    flags = [(n, os.path.abspath(v) if v and command.canonical(n) == command.KEY_FILE else v) for n, v in flags]
    check_port(port)
    from_layout = model is None and draft is None
    if model is None or draft is None:
        find = default_models if need_models else default_paths
        default_target, default_draft = find(recipe, models_dir)
        model, draft = model or default_target, draft or default_draft
    cards = len(where.gpus) if where else len(nvidia.detect_gpus()) if endpoints and not need_models else 0
    on_workers = with_workers(str(binary), endpoints, flags, need_models, resolved.env, cards) if endpoints else None
    flags = with_draft_device(flags, on_workers.draft_device if on_workers else None)
    spec = LaunchSpec(
        name=check_name(name or recipe.name), recipe=recipe.name, recipe_source=str(recipe.source.resolve()),
        binary=str(binary),
        target=str(Path(model).expanduser().resolve()), draft=str(Path(draft).expanduser().resolve()),
        host=host, port=port, flags=flags, recipe_flags=resolved.recipe_flags,
        policy=(policy or Policy()).validate(), no_api_key=no_api_key, context=context.to_json(),
        models_dir=str(models_dir) if from_layout else None, env=resolved.env, placement=resolved.placement,
        rpc=[str(e) for e in endpoints],
        rpc_devices=[{"name": d.name, "where": d.where} for d in on_workers.devices] if on_workers else [],
        draft_device=on_workers.draft_device if on_workers else None,
        draft_device_why=on_workers.why if on_workers else "",
    )
    key_in_flags = secrets.pop("--api-key", None)
    # Other secrets (a Hub token) go where every llama-server launch of this process inherits them
    # from, a detached supervisor's included; they are not part of the spec.
    os.environ.update({command.SECRET_ENV[flag]: value for flag, value in secrets.items()})
    key = api_key or key_in_flags or None
    if key and no_api_key:
        raise UsageError("--no-api-key contradicts the API key given (--api-key, BUUN_API_KEY or the recipe)",
                         "leave out one of them")
    return spec, key


def server_binary(built: bool = True) -> tuple[Path, str | None]:
    """llama-server's path, and None; before the build, with `built` off (--print-cmd, which the
    README offers to see the command early), the path `buun build` will make and the variant it
    picks here (the spec's missing_files says it is not built yet)."""
    try:
        return build.find_binary("llama-server"), None
    except NotReadyError:
        if built:
            raise
    if build.bin_dir_pinned():
        return Path(os.environ[build.BIN_DIR_ENV]) / "llama-server", None
    variant = build.choose_variant(cpu=False, cuda=False)
    return paths.build_dir(variant) / "bin" / "llama-server", variant


def check_port(port: int) -> None:
    """The server's --port, checked by every command that launches one before it does anything else."""
    if not 0 < port < 65536:
        raise UsageError(f"--port {port}: expected 1..65535")


def with_models_dir(spec: LaunchSpec, models_dir: Path) -> LaunchSpec:
    """The same launch with the recipe's models taken from `models_dir` (`buun restart --models-dir`)."""
    if spec.models_dir is None:
        raise UsageError(f"{spec.name} serves models given by path (--model/--draft), not from a models folder",
                         f"`buun stop {spec.name}`, then `buun start` with the models you want")
    target, draft = default_paths(recipes.load(spec.recipe_source), models_dir)
    return replace(spec, target=str(target.resolve()), draft=str(draft.resolve()), models_dir=str(models_dir))


@dataclass(frozen=True)
class Flags:
    """A recipe's server flags with the user's changes, as llama-server gets them."""

    flags: list[Flag]  # no secret among them
    secrets: dict[str, str]  # canonical flag -> value, for llama-server's environment (command.SECRET_ENV)
    context: context.ContextChoice  # the -c among the flags, and why
    recipe_flags: list[str]  # the recipe's flag names that reach llama-server as the recipe wrote them
    env: dict[str, str] = field(default_factory=dict)  # for llama-server's environment: the cards (devices.py)
    placement: dict[str, Any] | None = None  # the cards and the split (devices.with_split)


CPU_LAYERS = ("-ngl", "-ngld")  # the target's and the drafter's layers on a card: none for a CPU build


def launch_flags(recipe: recipes.Recipe, overrides: list[Flag], drops: list[str], source: str,
                 models_dir: Path, tree_budget: int | None = None, slots: int | None = None,
                 where: devices.Placement | None = None, workers: list[addresses.Endpoint] | None = None,
                 cpu_build: bool = False) -> Flags:
    """The flags of every server buun runs for a recipe, `buun serve`'s and each `buun bench`
    configuration's: the recipe's, with `overrides` in the place of the recipe's flag of the same
    option (or added) and `drops` left out, secrets taken out, the tree's flags settled
    (with_tree; a dropped --spec-tree-budget is the chain), the slots' (with_slots), -c decided
    (with_context, weighing the models in `models_dir`) and, on the cards `where` names, the split
    (devices.with_split). `workers` come first, as `--rpc`: llama-server must know them before it
    reads a device name (-dev, -devd). A `cpu_build` llama-server gets buun's default -c, not
    what fits the card nvidia-smi lists, and, without workers, `-ngl 0 -ngld 0` (there is no card
    to offload the recipe's layers to) unless the overrides say otherwise.
    `source` names where the overrides came from, for the error of a flag buun sets itself."""
    base = command.recipe_flags(recipe.server_flags)
    command.check_unmanaged(base, f"the recipe {recipe.source}")
    command.check_unmanaged(overrides, source)
    command.check_drops(drops)
    if cpu_build and not workers:  # as `buun setup --cpu` plans it: no layer to a card
        given = {command.canonical(n) for n, _ in overrides}
        overrides = [*((flag, "0") for flag in CPU_LAYERS if flag not in given), *overrides]
    # the recipe's secrets and the command line's alike (an override replaces the recipe's)
    flags, secrets = command.take_secrets(command.merge(base, overrides, drops))
    if workers:
        flags = [("--rpc", addresses.join(workers)), *flags]
    if command.TREE_BUDGET in {command.canonical(d) for d in drops}:
        tree_budget = 0  # no tree flag, not even the recipe's server.tree
    flags = with_tree(recipe, flags, overrides, tree_budget)
    flags = with_slots(recipe, flags, overrides, slots)
    flags, context = with_context(recipe, flags, overrides, models_dir, where, cpu_build)
    if where is None:
        return Flags(flags, secrets, context, _kept(base, overrides))
    flags, placed = devices.with_split(recipe, flags, where, context.value, models_dir)
    return Flags(flags, secrets, context, _kept(base, overrides), where.env, placed)


def check_one_split(endpoints: list[addresses.Endpoint], where: devices.Placement | None) -> None:
    """RPC workers with one local card at most: llama.cpp would put the target over both kinds of
    device at once, a plan neither `buun fit --gpus` nor rpc.place makes."""
    if endpoints and where and len(where.gpus) > 1:
        raise UsageError(f"--rpc with several cards ({','.join(map(str, where.gpus))}): buun splits the target over "
                         "this host's cards or over RPC workers, not both at once",
                         "pass one card (--gpus N) with --rpc, or leave out --rpc")


def with_draft_device(flags: list[Flag], device: str | None) -> list[Flag]:
    """The flags with `-devd device` (with_workers' choice) unless they name the drafter's device."""
    if device and not command.option(dict(flags), "-devd"):
        return [*flags, ("-devd", device)]
    return flags


def with_workers(binary: str, endpoints: list[addresses.Endpoint], flags: list[Flag], ask: bool,
                 env: dict[str, str] | None = None, cards: int = 0) -> rpc.Placement:
    """Where the target's layers and the drafter go with RPC workers (rpc.place). With `ask`, each
    worker must answer now and llama-server (with the cards' `env`) lists the devices; without
    (--print-cmd), each worker is taken to have one device, then the `cards` local ones."""
    if ask:
        rpc.check_reachable(endpoints)
    found = rpc.list_devices(binary, endpoints, env) if ask else rpc.assumed_devices(endpoints, cards)
    placement = rpc.place(found, flags)
    ours = rpc.place(found, [f for f in flags if command.canonical(f[0]) != "-devd"]).draft_device
    if ours and placement.draft_device != ours:
        console.warn(f"-devd {placement.draft_device}: the drafter shares the target's output matrix, which is on "
                     f"{ours} with these devices; elsewhere llama-server aborts at the first request (\"pre-allocated "
                     "tensor (output.weight) ... cannot run the operation\")")
    return placement


def check_exposure(spec: LaunchSpec, api_key: str | None) -> None:
    """command.check_exposure for a resolved launch (--no-api-key is kept in the spec for restarts)."""
    command.check_exposure(spec.host, spec.flags, api_key, spec.no_api_key)


def with_context(recipe: recipes.Recipe, flags: list[Flag], overrides: list[Flag], models_dir: Path,
                 where: devices.Placement | None = None, cpu_build: bool = False
                 ) -> tuple[list[Flag], context.ContextChoice]:
    """The flags with -c decided (context.choose_context): the command line's, the recipe's pinned
    number, or the largest that fits the GPU here (the cards `where` names: split by layers over
    several; weighing the models in `models_dir`); in the recipe's place, or added."""
    cards = None if where is None else list(where.cards)  # no nvidia-smi: no card to fit
    choice = context.choose_context(recipe, {n: True if v is None else v for n, v in flags},
                                from_command_line=any(command.canonical(n) == "-c" for n, _ in overrides),
                                models_dir=models_dir, gpus=cards,
                                draft=None if where is None else where.draft_position, cpu_build=cpu_build)
    at = next((i for i, (n, _) in enumerate(flags) if command.canonical(n) == "-c"), None)
    if at is None:
        return [*flags, ("-c", str(choice.value))], choice
    return [*flags[:at], (flags[at][0], str(choice.value)), *flags[at + 1:]], choice


def with_tree(recipe: recipes.Recipe, flags: list[Flag], overrides: list[Flag], budget: int | None) -> list[Flag]:
    """The flags with the tree's settings (patch 0023). The budget is --tree-budget's, else one among
    the flags (after `--` or in the recipe's server.flags, in any spelling), else the recipe's
    server.tree.budget. A tree (budget 2 or more) gets --spec-tree-budget N, and the recipe's
    --spec-tree-k unless the flags give one; the chain gets no tree flag: it is llama-server's
    default, so a build without 0023 serves it. A tree that does not fit one ubatch is refused here
    rather than by llama-server's assert."""
    if budget is not None and any(command.canonical(n) == command.TREE_BUDGET for n, _ in overrides):
        raise UsageError("--tree-budget and a --spec-tree-budget after `--` both set the tree budget",
                         "give one of them")
    given = [v for n, v in flags if command.canonical(n) == command.TREE_BUDGET]
    if budget is None and given:
        budget = budgets.parse(given[-1], command.TREE_BUDGET)
    n = budgets.check(recipe.tree_budget if budget is None else budget, "--tree-budget")
    out = [f for f in flags if command.canonical(f[0]) != command.TREE_BUDGET]
    if budgets.is_tree(n):
        out.append((command.TREE_BUDGET, str(n)))
        if not any(command.canonical(name) == command.TREE_K for name, _ in out):
            out.append((command.TREE_K, str(recipe.tree_k)))
    fit.check_tree(fit.flags_from_server_flags({name: True if v is None else v for name, v in out}))
    return out


def with_slots(recipe: recipes.Recipe, flags: list[Flag], overrides: list[Flag], slots: int | None) -> list[Flag]:
    """The flags with the slots' settings: -np N, N being --slots, else a -np among the flags (after
    `--` or in the recipe's server.flags), else the recipe's server.slots; and -ub and -b raised,
    where the recipe's are smaller, to hold every slot's verify in one ubatch (fit.with_slots), so
    that the slots verify in one target forward. A -ub or -b after `--` is kept as given, with a
    warning when it splits the slots' verify."""
    if slots is not None and any(command.canonical(n) == "-np" for n, _ in overrides):
        raise UsageError("--slots and a -np after `--` both set the number of slots", "give one of them")
    given = [v for n, v in flags if command.canonical(n) == "-np"]
    n = slots if slots is not None else _slots_flag(given[-1]) if given else recipe.slots
    given_flags = {name: True if v is None else v for name, v in flags}
    current = fit.flags_from_server_flags(given_flags)
    if command.option(given_flags, "--spec-type") is None:  # no drafter (bench's AR): a token a slot
        current = replace(current, draft_max=0)
    planned = fit.with_slots(recipe, current, n)
    out = [f for f in flags if command.canonical(f[0]) != "-np"] + [("-np", str(n))]
    if planned.ubatch <= min(current.ubatch, current.batch):
        return out
    mine = {command.canonical(name) for name, _ in overrides} & {"-ub", "-b"}
    if mine:
        console.warn(f"{n} slots verify {planned.ubatch} tokens a step, more than -ub {current.ubatch} "
                     f"(-b {current.batch}): the slots verify in more than one target forward "
                     f"(`-- -ub {planned.ubatch} -b {planned.batch}` holds them all)")
        return out
    return _set_flag(_set_flag(out, "-ub", planned.ubatch), "-b", planned.batch)


def _set_flag(flags: list[Flag], canonical_name: str, value: int) -> list[Flag]:
    """The flags with that option's value replaced in its place, or added."""
    at = next((i for i, (n, _) in enumerate(flags) if command.canonical(n) == canonical_name), None)
    if at is None:
        return [*flags, (canonical_name, str(value))]
    return [*flags[:at], (flags[at][0], str(value)), *flags[at + 1:]]


def _slots_flag(value: str | None) -> int:
    if value is None or not command.is_count(value):
        shown = "-np" + (f" {value}" if value is not None else " without a value")
        raise UsageError(f"{shown}: expected a number of slots", f"1 to {recipes.MAX_SLOTS}; `buun serve --slots N`")
    return int(value)


def _kept(base: list[Flag], overrides: list[Flag]) -> list[str]:
    """The recipe's flags that reach llama-server as the recipe wrote them (for error hints)."""
    over = {command.canonical(n) for n, _ in overrides}
    return [n for n, _ in base if command.canonical(n) not in over]


def child_env(api_key: str | None, own: dict[str, str] | None = None) -> dict[str, str]:
    """llama-server's environment: ours, with the launch's own variables (`own`: the cards) and the
    key in its own variable (never in argv)."""
    env = {k: v for k, v in os.environ.items() if k not in (command.API_KEY_ENV, API_KEY_ENV)}
    env.update(own or {})
    if api_key:
        env[command.API_KEY_ENV] = api_key
    return env
