"""The help of a command: plain text, options grouped in sections, the usage line as typed.

``AttnvizCommand`` is the Click command class of every attnviz command (``attnviz.cli.app`` makes it
the default of ``app.command``). Its help is Click's plain-text help (the app keeps
``rich_markup_mode=None``: no rich, no markdown, so ``--help`` stays fast), with two changes:

* **Sections.** The arguments come first, under ``Inputs``; then every option under the heading its
  ``rich_help_panel`` names (``Masks``, ``Learned parameters``, ``Labels``, ``Output`` ...), the sections
  in the order their first option is declared; options without a panel (``--help``) come last, under
  ``Options``.
* **Metavars.** The usage line names the arguments as they are typed, optional ones in brackets
  (``Usage: attnviz scaled [OPTIONS] Q [K] [V]``), not Typer's ``{Q}``; an argument that names a file
  is described as ``Q FILE``. An option's value reads ``--precision INTEGER``, ``--rope-theta FLOAT``,
  ``--title TEXT``, ``--device [auto|cpu|gpu]`` (Click's words) unless the option declares its own
  metavar (``--mask FILE``, ``--max-memory SIZE``), instead of Typer's ``<int range>`` and ``<str>``; a
  long list of choices goes into the help text instead (``--sort SORT ...; one of: layer, head, ...``).

Click's formatter wraps at 78 columns at most, so the help fits an 80-column terminal.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

TYPE_WORDS = {int: "INTEGER", float: "FLOAT", str: "TEXT"}


def argument_name(param: Any) -> str:
    """``Q FILE`` for an argument naming a file, else its metavar."""
    from attnviz.cli.completion import is_file_param

    name = str(param.metavar or param.name.upper())
    simple = name.replace("_", "").isalnum()
    return f"{name} FILE" if simple and is_file_param(param) else name


CHOICES_CELLS = 32  # longer lists of choices go into the help text, the option showing its name


def long_choices(param: Any) -> list[str] | None:
    """An option's choices when they are too many to show after its name."""
    desc = param.type_descriptor
    if param.metavar or not desc.is_choice:
        return None
    choices = [str(c) for c in desc.choices or ()]
    return choices if len("|".join(choices)) + 2 > CHOICES_CELLS else None


def option_value(param: Any) -> str:
    """What follows an option's name in the help: its metavar, its choices (or, when they are many, its
    name in capitals) or the word for its type."""
    if param.metavar:
        return str(param.metavar)
    desc = param.type_descriptor
    if long_choices(param):
        return str(param.name).upper()
    if desc.is_choice:
        return "[" + "|".join(str(c) for c in desc.choices or ()) + "]"
    return TYPE_WORDS.get(desc.annotation, param.display_type_rich(None) or "VALUE")


def option_name(param: Any) -> str:
    from typer._click.formatting import join_options

    names = [join_options(param.opts)[0]]
    if param.secondary_opts:
        names.append(join_options(param.secondary_opts)[0])
    value = "" if param.is_flag or param.count else " " + option_value(param)
    return " / ".join(n + value for n in names)


class AttnvizCommand(TyperCommand):
    """A command whose help shows its options in sections and its usage line with its arguments as
    they are typed (see the module)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name != "argument" or getattr(param, "hidden", False):
                continue
            name = str(param.metavar or param.name.upper())
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        sections: dict[str, list[tuple[str, str]]] = {"Inputs": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                sections["Inputs"].append((argument_name(param), record[1]))
            else:
                panel = getattr(param, "rich_help_panel", None) or "Options"
                text = record[1]
                many = long_choices(param)
                if many:  # before the [default: ...] Typer adds
                    words, bracket, extra = text.rpartition("  [") if "  [" in text else (text, "", "")
                    text = f"{words}; one of: {', '.join(many)}{bracket}{extra}".lstrip("; ")
                sections.setdefault(panel, []).append((option_name(param), text))
        options = sections.pop("Options", [])
        for name, rows in [*sections.items(), ("Options", options)]:
            if rows:
                with formatter.section(name):
                    formatter.write_dl(rows)
