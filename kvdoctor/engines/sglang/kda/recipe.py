"""Allocation recipes: how an engine (or a fork) sizes the per-slot KDA state and ReplaySSM rings.

A recipe is a small YAML file. Each tensor lists its per-slot shape as expressions over the layer's
symbols (per tensor-parallel rank):

    H   key heads              HV  value heads         K  key head dim     V  value head dim
    L   ring length (--linear-replayssm-cache-len)     W  short-conv kernel
    B   decode batch rows (for the per-row cursor tensors)

The slot dimension is an expression over `size` (the pool's request slots; sglang adds a padding
slot 0, hence `size + 1`). `cursor` is the caller's rule for the next ring cursor, over `m` (this
step's cursor), `L` and `flushed`. Expressions are parsed, never executed: only integers, these
names, + - * // %, comparisons, and/or/not and `x if c else y` are accepted.
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvdoctor.errors import InputError
from kvdoctor.resources import data_dir
from kvdoctor.load.yamlfile import load_validated

RECIPE_DIR = data_dir("recipes")
DEFAULT_RECIPE = "sglang-0.5.23"
MAX_RECIPE_BYTES = 64 * 1024

SHAPE_SYMBOLS = frozenset({"H", "HV", "K", "V", "L", "W", "B"})
SLOT_SYMBOLS = frozenset({"size"})
CURSOR_SYMBOLS = frozenset({"m", "L", "flushed"})
# "ssm" is the deploy's state dtype (--mamba-ssm-dtype), "conv" the conv-state dtype (bf16 in sglang).
DTYPES = ("ssm", "conv", "float32", "bfloat16", "float16", "int32", "int64", "bool")

_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
            ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}


class Expr:
    """An integer expression over named symbols, checked when parsed and evaluated by walking its tree."""

    def __init__(self, text: Union[str, int], allowed: frozenset[str]):
        self.text = str(text)
        try:
            self.tree = ast.parse(self.text, mode="eval").body
        except SyntaxError:
            raise ValueError(f"cannot parse expression {self.text!r}") from None
        self._check(self.tree, allowed)

    def _check(self, node: ast.AST, allowed: frozenset[str]) -> None:
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, int):
                raise ValueError(f"{self.text!r}: only integer constants are allowed")
        elif isinstance(node, ast.Name):
            if node.id not in allowed:
                raise ValueError(f"{self.text!r}: unknown name {node.id!r}; expected one of {sorted(allowed)}")
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            self._check(node.left, allowed)
            self._check(node.right, allowed)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
            self._check(node.operand, allowed)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            self._check(node.left, allowed)
            self._check(node.comparators[0], allowed)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                self._check(value, allowed)
        elif isinstance(node, ast.IfExp):
            for part in (node.test, node.body, node.orelse):
                self._check(part, allowed)
        else:
            raise ValueError(f"{self.text!r}: unsupported syntax {type(node).__name__}")

    def __call__(self, **values: int) -> int:
        """The value for these symbols; a division by zero is the recipe's input error."""
        return int(self._eval(self.tree, values))

    def _eval(self, node: ast.AST, env: dict[str, int]):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, env), self._eval(node.right, env)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
                raise InputError(f"KDA recipe expression {self.text!r} divides by zero for {env}")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            value = self._eval(node.operand, env)
            return -value if isinstance(node.op, ast.USub) else not value
        if isinstance(node, ast.Compare):
            return _COMPARE[type(node.ops[0])](self._eval(node.left, env), self._eval(node.comparators[0], env))
        if isinstance(node, ast.BoolOp):
            values = [self._eval(v, env) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        return self._eval(node.body if self._eval(node.test, env) else node.orelse, env)

    def names(self) -> set[str]:
        return {n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name)}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Shaped(_Strict):
    shape: list[Union[str, int]]
    dtype: str

    @field_validator("shape")
    @classmethod
    def _shape(cls, value: list) -> list:
        for item in value:
            Expr(item, SHAPE_SYMBOLS)
        return value

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        if value not in DTYPES:
            raise ValueError(f"unknown dtype {value!r}; expected one of {', '.join(DTYPES)}")
        return value


class TensorRecipe(_Shaped):
    """A per-slot tensor of the pool: dim 0 is the slot, `shape` the rest."""

    slots: Optional[Union[str, int]] = Field(None, description="dim-0 expression; None: the recipe's `slots`")

    @field_validator("slots")
    @classmethod
    def _slots(cls, value):
        if value is not None:
            Expr(value, SLOT_SYMBOLS)
        return value


class CursorRecipe(_Shaped):
    """A per-row tensor the caller passes (write_pos, force_flush): shape over B, no slot dim."""


class Tensors(_Strict):
    initial_state: TensorRecipe
    conv_state: Optional[TensorRecipe] = None
    d_cache: TensorRecipe
    k_cache: TensorRecipe
    g_cache: TensorRecipe


class Recipe(_Strict):
    name: str
    summary: str
    source: Optional[str] = None
    slots: Union[str, int] = "size + 1"
    tensors: Tensors
    write_pos: CursorRecipe
    force_flush: Optional[CursorRecipe] = None
    cursor: str = "0 if flushed else (m + 1) % L"
    path: Optional[str] = Field(None, exclude=True)
    lines: dict[str, int] = Field(default_factory=dict, exclude=True)

    @field_validator("slots")
    @classmethod
    def _slots(cls, value):
        Expr(value, SLOT_SYMBOLS)
        return value

    @field_validator("cursor")
    @classmethod
    def _cursor(cls, value: str) -> str:
        Expr(value, CURSOR_SYMBOLS)
        return value

    def slot_count(self, tensor: str, size: int) -> int:
        spec: TensorRecipe = getattr(self.tensors, tensor)
        return Expr(spec.slots if spec.slots is not None else self.slots, SLOT_SYMBOLS)(size=size)

    def next_cursor(self, m: int, L: int, flushed: bool) -> int:
        return _expr(self.cursor, CURSOR_SYMBOLS)(m=m, L=L, flushed=int(flushed))


@lru_cache(maxsize=256)
def _expr(text: str, allowed: frozenset[str]) -> Expr:
    return Expr(text, allowed)


def per_slot_shape(spec: Union[TensorRecipe, CursorRecipe], symbols: dict[str, int]) -> tuple[int, ...]:
    """The per-slot (or per-row) shape a recipe entry gives for these symbol values."""
    return tuple(_expr(str(item), SHAPE_SYMBOLS)(**symbols) for item in spec.shape)


def resolve_dtype(dtype: str, ssm_dtype: str, conv_dtype: str = "bfloat16") -> str:
    return {"ssm": ssm_dtype, "conv": conv_dtype}.get(dtype, dtype)


def builtin_names() -> list[str]:
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def load_recipe(name_or_path: str, relative_to: Optional[Path] = None) -> Recipe:
    """A built-in recipe by name, or a recipe YAML file (relative paths resolve from `relative_to`)."""
    builtin = RECIPE_DIR / f"{name_or_path}.yaml"
    if "/" not in name_or_path and not name_or_path.endswith((".yaml", ".yml")):
        if not builtin.is_file():
            raise InputError(f"unknown KDA recipe {name_or_path!r}; built-in recipes: {', '.join(builtin_names())} "
                             "(or give a path to a recipe YAML file)")
        return _parse(builtin)
    path = Path(name_or_path)
    if not path.is_absolute() and relative_to is not None:
        path = relative_to / path
    if not path.is_file():
        raise InputError(f"{path}: KDA recipe file not found")
    return _parse(path)


def _parse(path: Path) -> Recipe:
    recipe, lines = load_validated(path, Recipe, "KDA recipe", MAX_RECIPE_BYTES, field_word="KDA recipe field")
    shown = f"kvdoctor/data/recipes/{path.name}" if path.parent == RECIPE_DIR else str(path)
    return recipe.model_copy(update={"path": shown, "lines": lines})
