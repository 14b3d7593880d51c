"""The ``attnviz`` application: the Typer app, its command group (usage errors in attnviz's one-line
form, shell completion) and the one place where every command is registered: one compute command per
registered variant, then ``variants``, ``capture``, ``inspect``, ``merge``, ``compare``, ``rollout``, ``repeat-test``,
``batch``, ``serve`` and ``view``. Each command lives in its own module under ``attnviz.cli.commands``.

Results go to stdout (tables, or JSON with ``--json``); everything else (device, saved files,
warnings, errors) to stderr. Errors meant for users end the run with a one- or two-line message and
exit code 1 (bad data, run-time failure) or 2 (bad usage); nothing reaches the user as a traceback.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from typing import Annotated, Any, Literal

import typer
from typer.core import TyperGroup

from attnviz import __version__
from attnviz.cli.completion import SHELL_CHOICES
from attnviz.cli.errors import usage_errors
from attnviz.cli.parsers import checked_option

# NumPy's floating-point RuntimeWarnings ("invalid value encountered in cast") would reach users' stderr
# as Python warnings; attnviz checks non-finite values itself and says what they mean. Process-wide, as
# batch runs jobs in threads (warnings.catch_warnings is not thread-safe).
warnings.filterwarnings("ignore", message=r"(invalid value|overflow|divide by zero|underflow) encountered",
                        category=RuntimeWarning)


class AttnvizGroup(TyperGroup):
    """The command group: usage errors (unknown option or command, a bad or missing value, a
    missing argument) of any command end in attnviz's one line on stderr and exit 2, instead of
    Click's usage block. ``attnviz`` alone is one of them: a line naming ``attnviz --help``."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        if not extra.get("resilient_parsing"):  # a completion request completes the shell's name instead
            args = shell_optional(args)
        with usage_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with usage_errors():
            return super().invoke(ctx)

    def _main_shell_completion(self, ctx_args: Any, prog_name: str, complete_var: str | None = None) -> None:
        from attnviz.cli.completion import handle_request  # see there: files, both spellings, in process

        handle_request(self, ctx_args, prog_name, complete_var)


def shell_optional(args: list[str]) -> list[str]:
    """``--show-completion`` and ``--install-completion`` (before the command) without a shell's name
    take ``auto``: the shell is found out (``attnviz.cli.completion``)."""
    args = list(args)
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            break
        if arg in ("--show-completion", "--install-completion") and (i + 1 == len(args) or args[i + 1].startswith("-")):
            args.insert(i + 1, "auto")
            break
    return args


class AttnvizTyper(typer.Typer):
    """The app: every command's class is ``AttnvizCommand`` unless it says otherwise (help in sections,
    the usage line as typed: ``attnviz.cli.help``)."""

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Any:
        from attnviz.cli.help import AttnvizCommand

        return super().command(*args, cls=cls or AttnvizCommand, **kwargs)


def new_app() -> AttnvizTyper:
    """An ``attnviz`` app with its options (``--version``, ``--no-server``, completion) and no command yet."""
    made = AttnvizTyper(
        name="attnviz",
        cls=AttnvizGroup,
        help="Compute, inspect and visualise attention from the command line: tables, statistics, "
        "heatmap PNGs and JSON.",
        no_args_is_help=False,  # `attnviz` alone: one usage line naming --help (exit 2), not 40 lines of help
        add_completion=False,  # attnviz's own --install-completion/--show-completion [SHELL] (attnviz.cli.completion)
        rich_markup_mode=None,  # plain help: fast (no rich.markdown import) and brackets print as written
        pretty_exceptions_enable=False,
    )
    made.callback()(main)
    return made


def _completion(what: str, value: str | None) -> None:
    from attnviz.cli import completion

    (completion.install_callback if what == "install" else completion.show_callback)(value)


def _shells(incomplete: str) -> list[str]:  # TAB after --show-completion / --install-completion
    return [name for name in SHELL_CHOICES if name.startswith(incomplete)]


def _version(value: bool) -> None:
    from attnviz.cli.completion import completing

    if value and not completing():  # TAB after --version: complete, print no version into the answers
        typer.echo(f"attnviz {__version__}")
        raise typer.Exit()


def main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
    no_server: Annotated[bool, typer.Option("--no-server", help="run in this process, not on a warm worker "
                                                                "(attnviz serve; also ATTNVIZ_NO_SERVER=1)")] = False,
    storage_options: Annotated[str | None, typer.Option(
        "--storage-options", metavar="JSON|FILE", show_default=False,
        help="fsspec storage options for URLs (s3://, gs://, az:// ...): a JSON object, flat or by scheme "
             "('{\"s3\": {\"anon\": true}}'), or a JSON file holding one (also ATTNVIZ_STORAGE_OPTIONS); never "
             "printed")] = None,
    install_completion: Annotated[str | None, checked_option(
        Literal[SHELL_CHOICES], "--install-completion", metavar="[SHELL]", is_eager=True,  # type: ignore[misc]
        expose_value=False, callback=lambda value: _completion("install", value), autocompletion=_shells,
        help="install shell completion (commands, options, choices, files) for SHELL, or for the shell this "
             "runs in; it takes effect in a new shell")] = None,
    show_completion: Annotated[str | None, checked_option(
        Literal[SHELL_CHOICES], "--show-completion", metavar="[SHELL]", is_eager=True,  # type: ignore[misc]
        expose_value=False, callback=lambda value: _completion("show", value), autocompletion=_shells,
        help="print the completion script of SHELL (bash, zsh, fish, powershell), to install it by hand")] = None,
) -> None:
    """Compute, inspect and visualise attention from the command line.

    One command per attention type; `attnviz variants` lists them.
    """
    if storage_options is not None:
        from attnviz import storage
        from attnviz.cli.errors import user_errors

        with user_errors():
            storage.set_options(storage_options)


# ----------------------------------------------------------------------------------------------
# Every command, registered here and only here

#: the commands after the compute commands, in the order of ``attnviz --help``: name -> (module, function)
COMMANDS = {
    "capture": ("capture", "capture_command"),
    "ablate": ("ablate", "ablate_command"),
    "inspect": ("inspect", "inspect_command"),
    "merge": ("merge", "merge_command"),
    "compare": ("compare", "compare_command"),
    "batch": ("batch", "batch_command"),
    "serve": ("serve", "serve_command"),
    "rollout": ("rollout", "rollout_command"),
    "repeat-test": ("repeat_test", "repeat_test_command"),
    "view": ("view", "view_command"),
}


def register(target: AttnvizTyper, only: str | None = None) -> bool:
    """Register every command on ``target``: ``variants``, one compute command per registered variant,
    then COMMANDS. With ``only``, that command alone, importing its module only (a cold run of one
    command; ``attnviz.cli.console``). Whether anything was registered."""
    def command(module: str, function: str) -> Any:
        return getattr(importlib.import_module(f"attnviz.cli.commands.{module}"), function)

    found = False
    if only in (None, "variants"):
        target.command("variants")(command("variants", "variants_command"))
        found = True
    from attnviz.variants import REGISTRY

    for variant in REGISTRY.values():
        if only in (None, variant.name):
            made = command("compute", "make_command")(variant)
            target.command(variant.name, help=made.__doc__, short_help=variant.summary)(made)
            found = True
    for name, (module, function) in COMMANDS.items():
        if only in (None, name):
            target.command(name)(command(module, function))
            found = True
    return found


_BUILDING = threading.Lock()


def __getattr__(name: str) -> Any:
    """``app``, the application with every command, made on first use: a cold run of one command makes an
    app of that command alone (``attnviz.cli.console``) and imports no other command's module."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _BUILDING:
        if "app" not in globals():
            made = new_app()
            register(made)
            globals()["app"] = made
    return globals()["app"]
