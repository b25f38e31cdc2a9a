"""One launch of a server: which recipe, models, binary and address, its settings (settings.py:
resolved once, rendered by ServerSettings.render), and the rules the supervisor follows. Saved
as spec.json in the instance folder, so a detached supervisor and `buun restart` run exactly what
`buun start` resolved. No secret is part of it.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from buun_tool.base import command, console, nvidia, paths
from buun_tool.base.command import Flag
from buun_tool.base.errors import BuunError, NotReadyError, UsageError
from buun_tool.formats import gguf_tools, layout, recipes
from buun_tool.pipeline import build, convert, patches
from buun_tool.plan import devices
from buun_tool.server import addresses, rpc, settings, tuned
from buun_tool.server.settings import Launch, ServerSettings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


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
    tuned: str | None = None  # the tune's setting and where it came from, or why a tune was not applied
    serves_ar: bool = False  # a tune found AR faster on this card: no drafter (`draft` kept for a later tune)

    @property
    def settings(self) -> ServerSettings:
        """The server's settings as resolve made them (the spec keeps them flat: spec.json)."""
        return ServerSettings(list(self.flags), recipe_flags=list(self.recipe_flags), env=dict(self.env),
                              placement=self.placement, tuned=self.tuned, drafter=not self.serves_ar)

    def launch(self) -> Launch:
        return self.settings.render(self.binary, self.target, self.draft, self.host, self.port, alias=self.recipe)

    @property
    def argv(self) -> list[str]:
        return self.launch().argv

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
        roles = (("target model", self.target, "buun pull", "--model"),
                 *(() if self.serves_ar else (("drafter", self.draft, "buun convert", "--draft"),)))
        for role, path, fix, option in roles:
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
    dry-run: the build its build stage will make). A fresh tune of the recipe for these cards, build
    and models (server/tuned.py) is applied between the recipe and the command line."""
    from buun_tool.server.instance import check_name

    patches.rollback_from_env()  # llama-server would take a misspelt value for the tape without a word
    recipe = recipes.load(recipe_ref)
    binary, planned = server_binary(built=need_models)
    where = devices.placement(recipe, gpus, draft_gpu, binary)
    endpoints = addresses.parse(workers) if workers else []
    check_one_split(endpoints, where)
    if cpu_build is None:
        cpu_build = (planned or build.variant_of(binary)) == "cpu"
    from_layout = model is None and draft is None
    if model is None or draft is None:
        find = default_models if need_models else default_paths
        default_target, default_draft = find(recipe, models_dir)
        model, draft = model or default_target, draft or default_draft
    model, draft = Path(model).expanduser().resolve(), Path(draft).expanduser().resolve()
    found = tuned.find(recipe.name, where, cpu_build, binary, model, draft)
    resolved = settings.resolve(recipe, command.parse_args(extra or []), drops or [], "the arguments after `--`",
                                models_dir, tree_budget, slots, where, endpoints, cpu_build=cpu_build,
                                tuned=found.fresh)
    flags, secrets, context = resolved.flags, resolved.secrets, resolved.context
    # llama-server opens a key file from its own folder (buun's, when detached), and check_exposure
    # judges the keys in it from this one: the same file for both, and for a restart from elsewhere
    flags = [(n, os.path.abspath(v) if v and command.canonical(n) == command.KEY_FILE else v) for n, v in flags]
    check_port(port)
    cards = len(where.gpus) if where else len(nvidia.detect_gpus()) if endpoints and not need_models else 0
    on_workers = with_workers(str(binary), endpoints, flags, need_models, resolved.env, cards) if endpoints else None
    flags = settings.with_draft_device(flags, on_workers.draft_device if on_workers else None)
    spec = LaunchSpec(
        name=check_name(name or recipe.name), recipe=recipe.name, recipe_source=str(recipe.source.resolve()),
        binary=str(binary),
        target=str(model), draft=str(draft), tuned=resolved.tuned or (found.status() if found.stale else None),
        serves_ar=not resolved.drafter,
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


def check_one_split(endpoints: list[addresses.Endpoint], where: devices.Placement | None) -> None:
    """RPC workers with one local card at most: llama.cpp would put the target over both kinds of
    device at once, a plan neither `buun fit --gpus` nor rpc.place makes."""
    if endpoints and where and len(where.gpus) > 1:
        raise UsageError(f"--rpc with several cards ({','.join(map(str, where.gpus))}): buun splits the target over "
                         "this host's cards or over RPC workers, not both at once",
                         "pass one card (--gpus N) with --rpc, or leave out --rpc")


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
