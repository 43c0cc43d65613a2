"""`kvdoctor engines list` and `kvdoctor engines install ENGINE`: the engines' own Pythons that the dry
runs need (kvdoctor.engines.venvs has where they are and how they are built)."""
from __future__ import annotations

import json
import shlex
import subprocess
from typing import Any, Optional

import typer

from kvdoctor.errors import InputError

engines_app = typer.Typer(add_completion=False, no_args_is_help=True,
                          help="The engines and engine Pythons kvdoctor finds, and the one command that builds one.")


def _dry_run_engines() -> list[str]:
    from kvdoctor.engines.venvs import RECIPES

    return list(RECIPES)


def _engine_type():
    from kvdoctor.cli.types import engine_type

    return engine_type(_dry_run_engines)


@engines_app.command("list")
def list_cmd(output_format: str = typer.Option("text", "--format", help="text or json")) -> None:
    """Each engine profile, the Python its dry run uses, the versions there, and whether it can run."""
    from kvdoctor.engines import PROFILES, budget_engines, profile
    from kvdoctor.engines.pins import PINS
    from kvdoctor.engines.venvs import RECIPES, find, find_with_extra

    if output_format not in ("text", "json"):
        raise InputError(f"--format {output_format!r}: expected text or json")
    rows: list[dict[str, Any]] = []
    for engine in PROFILES:
        row: dict[str, Any] = {"engine": engine, "budget": engine in budget_engines(), "dry_run": None,
                               "python": None, "found_by": None, "versions": {}, "missing": [], "ready": False}
        prof = profile(engine)
        if engine in RECIPES:
            found, dist = find(engine), RECIPES[engine].dist
            row.update(dry_run="kvdoctor's Python" if RECIPES[engine].env_var is None else "child process",
                       install=f"kvdoctor engines install {engine}")
        elif prof.dry_run() is not None and prof.dry_run_extra is not None:  # mlx-lm: kvdoctor[mlx]
            found, dist = find_with_extra(engine, prof.dry_run_extra), next(iter(prof.pins))
            row.update(dry_run="kvdoctor's Python", install=f"pip install 'kvdoctor[{prof.dry_run_extra}]'")
        else:
            rows.append(row)
            continue
        row.update(python=str(found.python) if found.python else None, versions=found.versions,
                   found_by=found.source if found.python else None, missing=found.missing, ready=found.ready,
                   engine_dist=dist, describes=PINS[dist])
        rows.append(row)
    if output_format == "json":
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        typer.echo(_line(row))


def _line(row: dict) -> str:
    engine = row["engine"]
    if row["dry_run"] is None:
        return f"{engine:<11} no dry run (static plan{' and budget' if row['budget'] else ''} only)"
    if row["python"] is None:
        return f"{engine:<11} dry run: no Python found; {row['install']}"
    dist = row["engine_dist"]
    have = row["versions"].get(dist)
    described = f"{dist} {have}" if have else f"no {dist}"
    if have and have.split("+")[0] != row["describes"]:
        described += f" (kvdoctor describes {row['describes']})"
    state = "dry run ready" if row["ready"] else (
        f"dry run not ready: missing {', '.join(row['missing'][:6])}"
        f"{' ...' if len(row['missing']) > 6 else ''}; {row['install']}")
    return f"{engine:<11} {row['python']} ({row['found_by']}): {described}; {state}"


@engines_app.command("install")
def install_cmd(
    engine: str = typer.Argument(..., click_type=_engine_type(), help="The engine whose dry run to set up, "
                                 "ENGINE or ENGINE==RELEASE as --engine takes it (vllm==0.30.0)."),
    version: Optional[str] = typer.Option(None, "--version", help="The engine release, as ENGINE==RELEASE "
                                          "gives it (default: the one kvdoctor describes)."),
    torch_index: Optional[str] = typer.Option(None, "--torch-index", help="A package index for torch 2.13.0, "
                                              "e.g. https://download.pytorch.org/whl/cpu for the CPU build on "
                                              "Linux (default: pip's own)."),
    show: bool = typer.Option(False, "--print", help="Print the commands instead of running them."),
) -> None:
    """Build ENGINE's CPU Python where kvdoctor finds it (vllm, sglang: a venv of their own; sglang-mlx:
    kvdoctor's own Python), so that `check --engine ENGINE --dry-run` runs. Downloads about 1 GB."""
    from kvdoctor.engines.releases import split_engine
    from kvdoctor.engines.venvs import install_commands, target_python

    engine, named = split_engine(engine, "ENGINE")
    if named is not None and version is not None and named != version:
        raise InputError(f"ENGINE {engine}=={named} and --version {version} name two releases; give one")
    version = named or version
    commands = install_commands(engine, version, torch_index)
    if show:
        for command in commands:
            typer.echo(shlex.join(command))
        return
    for command in commands:
        typer.echo(f"$ {shlex.join(command)}", err=True)
        if subprocess.run(command).returncode != 0:
            raise InputError(f"`{shlex.join(command)}` failed (its output is above); nothing else was run")
    typer.echo(f"{engine}: {target_python(engine)} is ready; `kvdoctor engines list` shows it, and "
               f"`kvdoctor check MODEL --engine {engine} --dry-run` uses it")
