"""The command line's commands, a module each: Typer signatures and help only, the work done by library packages."""
