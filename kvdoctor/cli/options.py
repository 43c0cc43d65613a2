"""Options and arguments several commands take, declared once."""
from __future__ import annotations

import typer

from kvdoctor.cli.types import strict_type

OFFLINE = typer.Option(False, "--offline", help="Fetch nothing from a Hub (as HF_HUB_OFFLINE=1): a Hugging Face "
                       "id is read from the local cache or what kvdoctor fetched before.")
MODEL = typer.Argument(..., click_type=strict_type("Name", metavar="TARGET"),
                       help="A model directory or Hugging Face id (org/name[@revision]: the local cache, else the "
                            "Hub's metadata).")
