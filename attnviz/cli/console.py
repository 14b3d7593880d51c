"""The console script's in-process run: the Click command of the app, built once, and ``run(argv)``,
a cold run in this process (the console script's fallback when no worker answers); it builds only the
command it runs (see ``click_command``).

``click_command()`` is ``typer.main.get_command(app)`` with one change that makes a cold run start
faster: Typer coerces every parameter value through a pydantic ``TypeAdapter``, which imports pydantic
(and reads the installed packages' metadata for its plugins) on every run, about 60 ms. Every
parameter of attnviz is a ``str``, a ``bool`` flag or a value with attnviz's own parser
(``attnviz.cli.parsers``), for which that coercion is the identity or a call of the parser; those
parameters (and variadic arguments of strings, which become a list) get ``_Direct``, which does
exactly that and hands anything else (a value that is not already a ``str``, a parser raising
``ValueError``) to Typer's own coercion, so values and messages are Typer's. If Typer's internals
change shape, the command is left as Typer built it.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NoReturn

from attnviz.cli.runner import Runner, flush_quietly


@cache
def click_command(name: str | None = None) -> Any:
    """The command line as a Click command. With ``name``, a command of the app: the same group holding
    that command only, which is all a run of ``attnviz NAME ...`` looks at. Only that command's module is
    imported (80 ms less for ``inspect``), and Typer builds the parameters of that command only (30 ms for
    all of them, 2 ms for one)."""
    import typer.main

    from attnviz.cli.app import new_app, register

    source = new_app()
    if name is None or not register(source, only=name):  # the whole group: an unknown name's error
        from attnviz.cli.app import app

        source = app
    command = typer.main.get_command(source)
    try:
        _direct_coercion(command)
    except (ImportError, AttributeError, TypeError):  # another Typer: keep its own coercion
        pass
    return command


def _direct_coercion(command: Any) -> None:
    from dataclasses import dataclass

    from typer._coercion import RuntimeParam, build_runtime_param
    from typer.core import _TyperParameter

    @dataclass(frozen=True)
    class _Direct(RuntimeParam):
        """Typer's coercion without pydantic for str, bool and parser-checked values (see the module)."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            parser = self.parameter_info.parser
            if parser is not None:
                try:
                    return parser(value)
                except (ValueError, AssertionError):  # Typer words these itself
                    pass
            elif type(value) is self.annotation:
                return value
            elif self.annotation == list[str] and isinstance(value, tuple) and all(type(v) is str for v in value):
                return list(value)  # a variadic argument of strings, as Typer's adapter gives it
            return build_runtime_param(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)

    def direct(param: Any) -> None:
        if not isinstance(param, _TyperParameter) or param._runtime_param is not None:
            return
        desc = param.type_descriptor
        info = desc.parameter_info
        if desc.is_file:
            return
        if param.nargs == -1 and not param.multiple and desc.annotation == list[str]:
            param._runtime_param = _Direct(parameter_info=info, annotation=desc.annotation)
        elif param.multiple or param.nargs != 1:
            return
        elif info.parser is not None or desc.annotation in (str, bool):
            param._runtime_param = _Direct(parameter_info=info, annotation=desc.annotation)

    def with_direct_help(get_help_option: Any) -> Any:
        def wrapped(ctx: Any) -> Any:  # --help is made (once) per command when a context is
            option = get_help_option(ctx)
            if option is not None:
                direct(option)
            return option

        return wrapped

    commands = [command]
    while commands:
        cmd = commands.pop()
        commands.extend(getattr(cmd, "commands", {}).values())
        for param in cmd.params:
            direct(param)
        cmd.get_help_option = with_direct_help(cmd.get_help_option)


#: the runner of this process: the console script, ``attnviz batch`` and ``attnviz serve`` run commands through it
RUNNER = Runner(click_command)


def run(argv: list[str]) -> NoReturn:
    """Run the command line in this process, as ``attnviz ARGV``, and exit with its status. Ctrl-C, SIGTERM and
    SIGHUP end it as exceptions (``attnviz.interrupts``): what it staged is removed, exit 130, 143 or 129."""
    from attnviz import interrupts

    try:
        with interrupts.handled():
            code = RUNNER.execute(argv)
    except KeyboardInterrupt as exc:  # outside a command's own handling (while reading the options)
        code = interrupts.exit_code(exc)
        _say_interrupted(exc)
    finally:
        flush_quietly()
    raise SystemExit(code)


def _say_interrupted(exc: BaseException) -> None:
    import sys

    from attnviz.interrupts import said

    try:
        sys.stderr.write(f"attnviz: {said(exc)}\n")
    except (OSError, ValueError):
        pass
