"""The command line: one typer application (`app`), each command a thin function over `pipeline/` and
`fleet/`; `main` is the entry point."""
