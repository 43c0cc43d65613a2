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
    Check("kvdoctor.checks.cfg_semantics", tuple(f"CFG{n:03d}" for n in range(11, 21))),
    Check("kvdoctor.checks.ckpt", ("CKPT001", "CKPT002", "CKPT003", "CKPT004", "CKPT005", "CKPT006",
                                   "CKPT007", "CKPT008")),
    Check("kvdoctor.checks.eng", ("ENG001", "ENG002", "ENG003", "ENG004", "ENG005", "ENG006", "ENG007", "ENG008",
                                  "ENG011", "ENG013", "SWA005"), engines=("sglang-mlx",)),
    Check("kvdoctor.checks.swa", ("SWA001", "SWA002", "SWA003", "SWA004", "ENG009", "ENG010", "ENG012"),
          engines=("sglang-mlx",), static=False),
    Check("kvdoctor.checks.pool", ("POOL001", "POOL002", "POOL003"), engines=("sglang-mlx",), static=False),
    Check("kvdoctor.checks.dryrun", ("ENG050", "ENG051", "ENG052", "ENG053", "ENG054", "ENG055", "ENG056", "ENG057",
                                     "ENG058", "ENG059", "ENG060", "ENG061"), engines=("sglang-mlx",), static=False),
    Check("kvdoctor.checks.kda", ("KDA060", "KDA061", "KDA062"), engines=("sglang",)),
    Check("kvdoctor.checks.kda_caches", tuple(f"KDA{n:03d}" for n in (*range(1, 37), 40, 41, 42, 50, 51, 52)),
          engines=("sglang",), static=False),
    Check("kvdoctor.limits", ("LIM001",)),  # sizes probe caches up front; probes also raise it
    Check("kvdoctor.checks.budget", tuple(f"MEM{n:03d}" for n in range(1, 15))),  # runs when the deploy sets budget:
]

