"""Rule selection by code or prefix, ruff style: select, then extend-select, then ignore."""
from __future__ import annotations

from typing import Iterable

import msgspec


class Selection(msgspec.Struct, frozen=True):
    select: tuple[str, ...] = ("ALL",)
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    @staticmethod
    def _matches(code: str, selectors: Iterable[str]) -> float:
        """Length of the longest selector matching `code` (0: none). ALL matches with length 0.5."""
        best = 0.0
        for sel in selectors:
            if sel == "ALL":
                best = max(best, 0.5)
            elif code.startswith(sel):
                best = max(best, len(sel))
        return best

    def enabled(self, code: str) -> bool:
        chosen = max(self._matches(code, self.select), self._matches(code, self.extend_select))
        if not chosen:
            return False
        return self._matches(code, self.ignore) < chosen  # the more specific selector wins; ignore wins ties


def validate_selectors(selectors: Iterable[str], known: Iterable[str]) -> list[str]:
    """Selectors that match no known code (typos), so the CLI can refuse them."""
    known = list(known)
    return [s for s in selectors if s != "ALL" and not any(code.startswith(s) for code in known)]
