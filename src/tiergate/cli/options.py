"""Typer parameters made from tiergate.request's option table: the one definition of the gate's options.

`command(options, body, doc)` returns a function whose signature typer reads (one parameter per option, with
its flags, type, default, help, minimum and environment variable); calling it calls `body(values)` with the
parsed values by parameter name, as tiergate.request.parse gives them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Optional

import typer

from tiergate.request import Option

_TYPES = {"path": Path, "text": str, "int": int}


def parameter(opt: Option) -> tuple[Any, Any]:
    """(annotation, typer.Option) of one option."""
    extra: dict[str, Any] = {"help": opt.help}
    if opt.minimum is not None:
        extra["min"] = opt.minimum
    if opt.envvar:
        extra["envvar"] = opt.envvar
    if opt.kind == "many":
        return list[str], typer.Option([], *opt.flags, **extra)
    if opt.kind == "flag":
        return bool, typer.Option(bool(opt.default), *opt.flags, **extra)
    if opt.kind == "switch":
        return Optional[bool], typer.Option(None, f"{opt.flags[0]}/{opt.off_flag}", **extra)
    kind = _TYPES[opt.kind]
    if opt.required:
        return kind, typer.Option(..., *opt.flags, **extra)
    return (kind if opt.default is not None else Optional[kind]), typer.Option(opt.default, *opt.flags, **extra)


def command(options: Iterable[Option], body: Callable[[dict], None], doc: str) -> Callable[..., None]:
    """A typer command with these options that calls `body` with the values by parameter name."""
    options = list(options)

    def run(**values) -> None:
        body(values)

    params, annotations = [], {}
    for opt in options:
        annotation, default = parameter(opt)
        params.append(inspect.Parameter(opt.param, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=annotation))
        annotations[opt.param] = annotation
    run.__signature__ = inspect.Signature(params, return_annotation=None)
    run.__annotations__ = {**annotations, "return": None}
    run.__doc__ = doc
    return run
