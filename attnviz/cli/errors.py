"""How the command line says what went wrong: one line of inert text on stderr (``attnviz: error:
...``) and the exit code: 1 for bad data or a run-time failure, 2 for a usage error (Click's
usage errors reworded here: ``--device 'tpu': expected one of auto, cpu, gpu.``), never a traceback.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

from attnviz.cli.parsers import OptionValueError, shown
from attnviz.errors import AttnvizError
from attnviz.streams import err_console, silence, stderr
from attnviz.text import user_text


def error_line(message: str, kind: str = "error") -> str:
    """An error as attnviz prints it on stderr: one line of inert text (control characters escaped,
    a line feed too: a file name holding one cannot forge a second message line), written as is (no
    markup, no emoji codes)."""
    return f"attnviz: {kind}: {user_text(message, limit=None)}\n"



def _flag(param: Any) -> str:
    """How a message names a parameter: its long option, or an argument's metavar."""
    if param is None:
        return "option"
    if getattr(param, "param_type_name", "") == "argument":
        return str(param.metavar or param.name or "argument").strip("{}[]").upper()
    opts = [o for o in param.opts if o.startswith("--")] or list(param.opts)
    return max(opts, key=len) if opts else str(param.name)


def _usage(ctx: Any) -> str:
    if ctx is None or ctx.command is None:
        return ""
    pieces = " ".join(ctx.command.collect_usage_pieces(ctx)).replace("{", "").replace("}", "")
    return f"{ctx.command_path} {pieces}".strip()


def _sentence(text: str) -> str:
    text = user_text(" ".join(text.split()), limit=300)
    if len(text) > 1 and text[0].isupper() and text[1].islower():
        text = text[0].lower() + text[1:]
    return text if text.endswith((".", "?", "!")) else text + "."


def _either(names: list[str]) -> str:
    names = [user_text(n) for n in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


#: Typer's own number checks (options declared without ``typed``), as attnviz words them
_PYDANTIC = {"int_parsing": "expected a whole number", "int_type": "expected a whole number",
             "int_from_float": "expected a whole number", "float_parsing": "expected a number",
             "float_type": "expected a number", "finite_number": "must be a finite number",
             "greater_than_equal": "must be at least {ge}", "less_than_equal": "must be at most {le}",
             "greater_than": "must be greater than {gt}", "less_than": "must be less than {lt}"}


def _bad_parameter(exc: Any) -> str:
    flag = _flag(exc.param)
    value, problem = None, exc.message
    cause = exc.__cause__
    errors = cause.errors() if hasattr(cause, "errors") else []
    if errors:
        first = errors[0]
        value = first.get("input")
        template = _PYDANTIC.get(first.get("type", ""))
        problem = template.format(**first.get("ctx", {})) if template else str(first.get("msg", problem))
        problem = problem.removeprefix("Value error, ")
    problem = _sentence(problem)
    return f"{flag} {shown(value)}: {problem}" if value is not None else f"{flag}: {problem}"


def usage_message(exc: Exception) -> str:
    """A usage error of the command line (Typer's Click: unknown option or command, bad or missing
    value, missing argument) as one line: ``--device 'tpu': expected one of auto, cpu, gpu.``"""
    from typer._click import exceptions as clk  # Typer vendors Click

    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "attnviz"
    if isinstance(exc, OptionValueError):
        return f"{_flag(exc.param)} {shown(exc.value)}: {exc.problem}."
    if isinstance(exc, clk.MissingParameter):
        if getattr(exc.param, "param_type_name", "") == "argument":
            usage = _usage(ctx)
            return f"missing argument {_flag(exc.param)}" + (f"; usage: {usage}." if usage else ".")
        return f"missing option {_flag(exc.param)}."
    if isinstance(exc, clk.BadParameter):
        return _bad_parameter(exc)
    if isinstance(exc, clk.NoSuchOption):
        name = shown(exc.option_name).strip("'")
        if exc.possibilities:
            return f"{name}: no such option of {command}; did you mean {_either(sorted(exc.possibilities))}?"
        return f"{name}: no such option of {command} (`{command} --help` lists them)."
    if isinstance(exc, clk.BadOptionUsage):
        name = shown(exc.option_name).strip("'")
        if " requires " in exc.message:
            return f"{name}: needs a value."
        if "does not take a value" in exc.message:
            return f"{name}: a flag, it takes no value."
        return f"{name}: {_sentence(exc.message)}"
    message = exc.format_message() if isinstance(exc, clk.ClickException) else str(exc)
    unknown = re.fullmatch(r"No such command (.+?)\.(?: Did you mean (.+)\?)?", message)
    if unknown:
        hint = f"; did you mean {unknown.group(2)}?" if unknown.group(2) else f" (`{command} --help` lists them)."
        return f"{user_text(unknown.group(1), 60)}: no such command{hint}"
    if message == "Missing command.":
        return (f"missing command: `{command} COMMAND ...`, e.g. `{command} scaled q.npy k.npy v.npy` or "
                f"`{command} inspect attn.npz` (`{command} --help` lists the commands).")
    text = _sentence(message.removeprefix("Got "))
    usage = _usage(ctx) if ctx is not None and ctx.parent is not None else ""
    return f"{text.rstrip('.')}; usage: {usage}." if usage else text




@contextmanager
def usage_errors() -> Iterator[None]:
    """Click's usage errors as attnviz's one line on stderr, exit 2 (the command group wraps parsing
    and invoking in this)."""
    from typer._click.exceptions import ClickException, NoArgsIsHelpError  # Typer vendors Click

    try:
        yield
    except NoArgsIsHelpError:
        raise
    except ClickException as exc:
        stderr().write(error_line(usage_message(exc)))
        raise typer.Exit(exc.exit_code) from None
    except BrokenPipeError:  # help or --version into `| head`: a reader that went away is no error
        silence(sys.stdout)
        raise typer.Exit(0) from None


def _say_ended(exc: BaseException) -> None:
    """``attnviz: interrupted`` (or terminated, hung up) on stderr, where it can still be written: after SIGHUP
    the terminal is gone (a write fails with EIO), and the exit status says it all the same."""
    from attnviz.interrupts import said

    try:
        err_console().print(f"attnviz: {said(exc)}", markup=False)
    except (OSError, ValueError):
        pass


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn errors meant for users into a message on stderr and the exit code; hide tracebacks of
    unexpected errors too unless ATTNVIZ_DEBUG is set."""
    try:
        yield
    except AttnvizError as exc:
        stderr().write(error_line(exc.message))
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM or SIGHUP (interrupts.Terminated): staged files are gone
        from attnviz.interrupts import exit_code

        _say_ended(exc)
        raise typer.Exit(exit_code(exc)) from None
    except (typer.Exit, typer.Abort):
        raise
    except BrokenPipeError:  # a write past attnviz.streams' guards: the output ends, not as an error
        silence(sys.stdout)
        raise typer.Exit(0) from None
    except Exception as exc:  # a bug: say so briefly, keep the traceback for those who ask
        from attnviz.interrupts import interruption, received

        # Ctrl-C or SIGTERM turned into another error on its way: by Python (while a class was made or an
        # extension module initialised: the signal is the cause) or by a compiled library that took it for a
        # failed conversion of its arguments (pybind11: a TypeError, the cause lost; the signal was received)
        signum = received()
        signalled = interruption(exc)
        if signalled is not None or signum is not None:
            from attnviz.interrupts import Terminated, exit_code

            if signalled is None:
                signalled = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum or signal.SIGTERM)
            _say_ended(signalled)
            raise typer.Exit(exit_code(signalled)) from None
        if os.environ.get("ATTNVIZ_DEBUG"):
            raise
        stderr().write(error_line(f"{type(exc).__name__}: {exc}", "internal error")
                       + "This is a bug; rerun with ATTNVIZ_DEBUG=1 for the traceback and please report it.\n")
        raise typer.Exit(1) from None
