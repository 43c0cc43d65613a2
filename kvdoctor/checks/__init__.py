"""Rule families. Each module has `run(ctx) -> Iterable[Finding]` and declares the codes it emits;
a module is imported only when one of its codes is selected, so a static check never loads torch
or mlx."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Iterable

from kvdoctor.model import Finding


@dataclass(frozen=True)
class Check:
    module: str
    codes: tuple[str, ...]
    engines: tuple[str, ...] | None = None  # None: runs for every engine
    static: bool = True  # False: builds caches or runs kernels (skipped by --static)

    def runner(self) -> Callable[..., Iterable[Finding]]:
        return importlib.import_module(self.module).run


CHECKS: list[Check] = [
    Check("kvdoctor.checks.cfg", ("CFG001", "CFG002", "CFG003", "CFG004", "CFG005", "CFG006", "CFG007",
                                  "CFG008", "CFG009", "CFG010")),
    Check("kvdoctor.checks.ckpt", ("CKPT001", "CKPT002", "CKPT003", "CKPT004", "CKPT005", "CKPT006",
                                   "CKPT007", "CKPT008")),
]


def register(check: Check) -> None:
    CHECKS.append(check)
