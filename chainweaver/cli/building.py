"""What ``serve``, ``inspect`` and ``worker`` build before they serve or report: the
FlowServer that the tools, the flow files and every server flag make (token, key and
instructions files read, access, tasks, run history and shared governance set up), and
the errors loading them raises as one :class:`CommandError` with its exit code.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ChainWeaverError, needs_extra
from ..flows import FlowLifecycle
from ..governance.state import GovernanceSettings
from ..safety import SideEffectLevel
from .errors import EXIT_INVALID, EXIT_MISSING, EXIT_USAGE, CommandError
from .loading import load_executor
from .output import PROG


@contextmanager
def loading_errors() -> Iterator[None]:
    """Around loading and building: what tools modules print goes to stderr (stdout is
    only for MCP or the report); a missing file or module exits 2, an invalid flow file,
    tool set or server policy 1."""
    try:
        with redirect_stdout(sys.stderr):
            yield
    except CommandError:
        raise
    except (FileNotFoundError, ModuleNotFoundError) as error:
        raise CommandError(EXIT_MISSING, str(error)) from None
    except ChainWeaverError as error:  # flow files, duplicate flows, server policy
        raise CommandError(EXIT_INVALID, str(error)) from None


def _values(raw: list[str] | None, flag: str, enum: type[Enum] | None = None) -> list[str] | None:
    """Repeated and comma-separated flag values; checked against ``enum`` when given."""
    if raw is None:
        return None
    values = [part.strip() for item in raw for part in item.split(",") if part.strip()]
    if not values:
        raise CommandError(EXIT_INVALID, f"{flag} needs at least one value")
    if enum is not None:
        choices = [member.value for member in enum]
        for value in values:
            if value not in choices:
                raise CommandError(EXIT_INVALID, f"{flag}: {value!r} is not one of "
                                   f"{', '.join(choices)}")
    return values


@contextmanager
def _quiet_exposure_log() -> Iterator[None]:
    """The CLI reports exclusions itself; the server's per-flow warnings would repeat them."""
    logger = logging.getLogger("chainweaver.mcp")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


class Built(NamedTuple):
    server: Any  # a chainweaver.mcp.FlowServer (imported lazily: it needs the mcp extra)
    files: int
    tools: int
    metrics: Any = None  # the metrics reader --metrics-port serves (serve only)

    def report(self) -> list[str]:
        """What was loaded, and which flows are exposed or excluded (with why)."""
        report = self.server.exposure_report()
        exposed = [entry.flow_name for entry in report if entry.exposed]
        lines = [f"{PROG}: loaded {self.files} flow file(s) and {self.tools} tool(s)",
                 f"{PROG}: exposed {len(exposed)} of {len(report)} flows: "
                 f"{', '.join(exposed) or 'none'}"]
        return lines + [f"{PROG}: excluded {e.flow_name} v{e.version}: {e.reason}"
                        for e in report if not e.exposed]


def build_server(args: argparse.Namespace) -> Built:
    """Load tools, flow files and policy, and decide the exposure. Serves nothing."""
    try:
        from ..mcp import (
            Discovery,
            ExposurePolicy,
            FlowServer,
            PromptPolicy,
            SecurityConfig,
            ServingConfig,
        )
    except ImportError:
        raise CommandError(EXIT_MISSING, needs_extra(f"{PROG} {args.command}", "mcp")
                           ) from None

    instructions = _instructions(args)
    access = access_settings(args)
    lifecycles = _values(args.lifecycle, "--lifecycle", FlowLifecycle)
    side_effects = _values(args.side_effects, "--side-effects", SideEffectLevel)
    owners = _values(args.owner, "--owner")
    prompts = PromptPolicy(kinds=_values(args.prompt_kinds, "--prompt-kinds"),
                           flow_names=_values(args.prompt_flow, "--prompt-flow"))
    provider, reader = _metrics(args)
    executor, loaded = load_executor(args.paths, args.tools)
    state_keys = (load_state_keys(args.request_state_key_file)
                  if args.request_state_key_file is not None else None)
    with _quiet_exposure_log():
        server = FlowServer(
            executor,
            expose_schemas=args.expose_schemas,
            expose_prompts=args.expose_prompts,
            policy=ExposurePolicy(
                server_prefix=args.prefix,
                allowed_lifecycles=lifecycles,
                allowed_side_effects=side_effects,
                owners=owners,
                allow_requires_approval=args.allow_requires_approval,
                prompts=prompts,
                **_given(approval=args.approval),
            ),
            security=SecurityConfig(**access.security,
                                    allowed_hosts=args.allowed_host,
                                    allowed_origins=args.allowed_origin,
                                    request_state_keys=state_keys,
                                    **_given(error_detail=args.error_detail,
                                             max_body_bytes=args.max_body_bytes,
                                             max_listen_streams_per_caller=args
                                             .max_listen_streams_per_caller,
                                             max_listen_streams=args.max_listen_streams)),
            serving=ServingConfig(flow_timeout=args.flow_timeout, page_size=args.page_size,
                                  run_notifications=args.run_notifications,
                                  name=args.name, instructions=instructions,
                                  **access.serving,
                                  **_given(approval_timeout=args.approval_timeout)),
            tasks=_task_settings(args),
            run_history=run_history_settings(args),
            governance=governance_settings(args),
            discovery=Discovery(registry_name=args.registry_name, cache_ttl=args.cache_ttl),
            meter_provider=provider,
        )
        # Judge every flow now: the command prints its own report of them, so the
        # library's per-flow log lines would only repeat it.
        server.exposure_report()
    _watch(args, server, loaded)
    return Built(server, len(loaded), len(executor.tools), reader)


def _metrics(args: argparse.Namespace) -> tuple[Any, Any]:
    """``serve --metrics-port``: an SDK meter provider and the reader a scrape reads."""
    if args.command != "serve" or args.metrics_port is None:
        return None, None
    from ..mcp.runs.prometheus import metrics_pipeline

    try:
        return metrics_pipeline()
    except ImportError as error:
        raise CommandError(EXIT_MISSING, f"--metrics-port: {error}") from None


def _watch(args: argparse.Namespace, server: Any, loaded: dict[Path, Any]) -> None:
    """``serve --watch``: reload the flow files as they change, while serving."""
    if args.command != "serve" or not args.watch:
        return
    from ..watch import FlowFileWatcher

    logger = logging.getLogger("chainweaver.watch")
    if not logger.handlers:  # reloads and bad edits are reported on stderr
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("chainweaver: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    server.watch(FlowFileWatcher(server.executor.registry, args.paths,
                                 tools=server.executor.tools,
                                 interval=args.watch_interval, loaded=loaded))


def _task_settings(args: argparse.Namespace) -> Any:
    """FlowServer's ``tasks`` (a TaskSettings) from --tasks and the --task-* flags."""
    from ..mcp import TaskSettings

    if args.tasks is None:
        if args.task_concurrency is not None or args.task_redelivery is not None:
            raise CommandError(EXIT_USAGE, "--task-concurrency and --task-redelivery need "
                               "--tasks")
        return None
    return TaskSettings(url=args.tasks, mode=args.task_mode,
                        concurrency=args.task_concurrency,
                        redelivery_timeout=args.task_redelivery)


def _given(**settings: Any) -> dict[str, Any]:
    """The settings whose flag was given; the others keep the library's default."""
    return {name: value for name, value in settings.items() if value is not None}


def _instructions(args: argparse.Namespace) -> str | None:
    if args.instructions_file is None:
        return args.instructions
    if args.instructions is not None:
        raise CommandError(EXIT_USAGE, "--instructions and --instructions-file cannot be "
                           "used together")
    text = _read_text(args.instructions_file, "--instructions-file").strip()
    if not text:
        raise CommandError(EXIT_INVALID, f"--instructions-file {args.instructions_file}: "
                           "the file is empty")
    return text


def _read_text(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CommandError(EXIT_MISSING, f"{flag} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise CommandError(EXIT_MISSING, f"{flag} {path}: cannot be read: {reason}") from None


def load_state_keys(path: str) -> list[str]:
    """The request-state keys listed in ``path``: one per line, at least 32 bytes each
    (blank lines and lines starting with ``#`` are skipped). Never echoes a key."""
    keys = []
    for number, line in enumerate(_read_text(path, "--request-state-key-file").splitlines(),
                                  1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        if len(key.encode("utf-8")) < 32:
            raise CommandError(EXIT_INVALID, f"--request-state-key-file {path}, line {number}: "
                               "a key needs at least 32 bytes (make one with: python -c "
                               "'import secrets; print(secrets.token_hex(32))')")
        keys.append(key)
    if not keys:
        raise CommandError(EXIT_INVALID, f"--request-state-key-file {path}: the file lists "
                           "no keys")
    return keys


# RFC 6750's token68 alphabet: what may follow "Bearer " in an Authorization header.
BEARER_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def load_token_file(path: str) -> Any:
    """A FastMCP ``StaticTokenVerifier`` accepting the tokens listed in ``path``.

    One token per line; blank lines and lines starting with ``#`` are skipped. The
    caller of line N is ``token-N`` (the line, never the token, identifies it in logs).
    """
    from fastmcp.server.auth import StaticTokenVerifier

    tokens: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(_read_text(path, "--auth-token-file").splitlines(), 1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        if not BEARER_TOKEN.fullmatch(token):
            raise CommandError(EXIT_INVALID, f"--auth-token-file {path}, line {number}: not "
                               "a bearer token (letters, digits and -._~+/ then any '=', "
                               "no spaces)")
        tokens.setdefault(token, {"client_id": f"token-{number}", "scopes": []})
    if not tokens:
        raise CommandError(EXIT_INVALID, f"--auth-token-file {path}: the file lists no "
                           "tokens")
    return StaticTokenVerifier(tokens=tokens)


class Access(NamedTuple):
    security: dict[str, Any]  # SecurityConfig settings
    serving: dict[str, Any]  # ServingConfig settings


def access_settings(args: argparse.Namespace) -> Access:
    """The --auth-*, --visible-claim, --rate-*, --audit-log and --*-as-tools settings."""
    from ..mcp import FixedWindowRateLimiter, visible_claim
    from ..mcp.gate.audit_log import JsonlAuditLog

    jwt = [flag for flag, value in (("--auth-jwks-uri", args.auth_jwks_uri),
                                    ("--auth-public-key", args.auth_public_key))
           if value is not None]
    claims = [flag for flag, value in (("--auth-issuer", args.auth_issuer),
                                       ("--auth-audience", args.auth_audience))
              if value is not None]
    if args.transport != "streamable-http" and (jwt or claims):
        raise CommandError(EXIT_USAGE, f"{', '.join(jwt + claims)} only appl"
                           f"{'ies' if len(jwt + claims) == 1 else 'y'} to --transport "
                           "streamable-http")
    if len(jwt) + (args.auth_token_file is not None) > 1:
        raise CommandError(EXIT_USAGE, "give one of --auth-jwks-uri, --auth-public-key and "
                           "--auth-token-file")
    if claims and not jwt:
        raise CommandError(EXIT_USAGE, f"{', '.join(claims)} need --auth-jwks-uri or "
                           "--auth-public-key")
    security: dict[str, Any] = {}
    if args.auth_token_file is not None:
        security["auth"] = load_token_file(args.auth_token_file)
    elif jwt:
        from fastmcp.server.auth.providers.jwt import JWTVerifier

        key = (None if args.auth_public_key is None
               else _public_key(args.auth_public_key))
        try:
            security["auth"] = JWTVerifier(public_key=key, jwks_uri=args.auth_jwks_uri,
                                           issuer=args.auth_issuer,
                                           audience=args.auth_audience)
        except ValueError as error:
            raise CommandError(EXIT_INVALID, f"{jwt[0]}: {error}") from None
    if args.rate_limit is None and (args.rate_window or args.rate_limit_redis):
        raise CommandError(EXIT_USAGE, "--rate-window and --rate-limit-redis need "
                           "--rate-limit")
    if args.rate_limit is not None:
        window = args.rate_window or 60.0
        if args.rate_limit_redis is None:
            security["rate_limiter"] = FixedWindowRateLimiter(args.rate_limit, window)
        else:
            try:
                from ..mcp.gate.rate_limit import RedisRateLimiter

                security["rate_limiter"] = RedisRateLimiter(args.rate_limit_redis,
                                                            args.rate_limit, window)
            except ImportError:
                raise CommandError(EXIT_MISSING,
                                   needs_extra("--rate-limit-redis", "tasks")) from None
            except ValueError as error:
                raise CommandError(EXIT_INVALID, f"--rate-limit-redis: {error}") from None
    if args.audit_log is not None:
        try:
            security["audit_hook"] = JsonlAuditLog(args.audit_log)
        except OSError as error:
            raise CommandError(EXIT_MISSING, f"--audit-log {args.audit_log}: cannot be "
                               f"opened: {error.strerror or error}") from None
    serving = {"resources_as_tools": args.resources_as_tools,
               "prompts_as_tools": args.prompts_as_tools}
    if args.visible_claim is not None:
        security["visible"] = visible_claim(args.visible_claim)
    return Access(security, serving)


def _public_key(path: str) -> str:
    """The PEM public key in ``path``, checked now: a bad key would refuse every token."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    text = _read_text(path, "--auth-public-key")
    try:
        load_pem_public_key(text.encode("utf-8"))
    except (ValueError, TypeError):
        raise CommandError(EXIT_INVALID, f"--auth-public-key {path}: not a PEM public "
                           "key") from None
    return text


def governance_settings(args: argparse.Namespace) -> Any:
    """``FlowServer(governance=...)`` from the flags (None without --governance)."""
    if args.governance is None:
        if args.governance_prefix or args.governance_stop_after:
            raise CommandError(EXIT_USAGE, "--governance-prefix and "
                               "--governance-stop-after need --governance")
        return None
    logger = logging.getLogger("chainweaver.governance")
    if args.command != "inspect" and not logger.handlers:  # applies and outages
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("chainweaver: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    options: dict[str, Any] = {"url": args.governance}
    if args.governance_prefix:
        options["prefix"] = args.governance_prefix
    if args.governance_stop_after is not None:
        options["stop_serving_after"] = args.governance_stop_after
    return GovernanceSettings(**options)


HISTORY_FLAGS = (("--run-history-max-runs", "run_history_max_runs", "max_runs"),
                 ("--run-history-max-age", "run_history_max_age", "max_age"),
                 ("--output-limit", "output_limit", "output_limit"))


def run_history_settings(args: argparse.Namespace) -> Any:
    """The ``RunHistory`` the flags ask for (None: no --run-history). A bound without
    --run-history is refused: without a history, runs keep no record and outputs are
    sent whole."""
    given = {field: getattr(args, name) for _, name, field in HISTORY_FLAGS
             if getattr(args, name, None) is not None}
    url = getattr(args, "run_history", None)
    if url is None:
        if given:
            flags = [flag for flag, name, _ in HISTORY_FLAGS
                     if getattr(args, name, None) is not None]
            raise CommandError(EXIT_USAGE, f"{', '.join(flags)} need"
                               f"{'s' if len(flags) == 1 else ''} --run-history URL")
        return None
    from ..mcp.config import RunHistory

    return RunHistory(store=url, **given)
