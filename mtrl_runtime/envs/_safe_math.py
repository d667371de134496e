"""Arithmetic from untrusted text (a model's answer, a calculator tool) without ``eval``.

``safe_eval`` parses with ``ast`` and walks an allow-list: numbers, ``+ - * /
// % **``, unary signs, parentheses, a few ``math`` functions and constants.
Any other node is a ``ValueError`` naming it. Integer results are kept below
``MAX_INT_BITS`` and exponents below ``MAX_EXPONENT`` so ``9**9**9`` fails
fast instead of eating the machine. Every failure, including division by zero
and overflow, is a ``ValueError``, so a reward function needs one ``except``.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable

Number = int | float

MAX_EXPR_CHARS = 2_000  # longer input is not a calculator expression
MAX_EXPONENT = 1_000  # |b| in a ** b; larger exponents are never needed for task arithmetic
MAX_INT_BITS = 4_096  # ~1,233 decimal digits: room for exact answers, no memory blow-up

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Number]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "floor": math.floor,
    "ceil": math.ceil,
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}
_MAX_ARGS = 16


def safe_eval(expr: str) -> Number:
    """The value of an arithmetic expression, e.g. ``safe_eval("2 * (3 + 4) ** 2") == 98``."""
    if not isinstance(expr, str):
        raise ValueError(f"expr must be a string, got {type(expr).__name__}")
    if len(expr) > MAX_EXPR_CHARS:
        raise ValueError(f"expression is {len(expr)} characters; the limit is {MAX_EXPR_CHARS}")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
        return _Evaluator().visit(tree.body)
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg} in {_clip(expr)!r}") from None
    except ZeroDivisionError:
        raise ValueError(f"division by zero in {_clip(expr)!r}") from None
    except OverflowError:
        raise ValueError(f"result too large in {_clip(expr)!r}") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"expression nested too deeply: {_clip(expr)!r}") from None


class _Evaluator(ast.NodeVisitor):
    """Evaluates the allowed nodes; ``generic_visit`` (any other node) refuses."""

    def visit_Constant(self, node: ast.Constant) -> Number:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"unsupported constant {value!r} (Constant): only numbers are allowed")
        return _checked(value)

    def visit_Name(self, node: ast.Name) -> Number:
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise ValueError(f"unknown name {node.id!r} (Name); allowed constants: {', '.join(_CONSTANTS)}")

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Number:
        op = _UNARY.get(type(node.op))
        if op is None:
            raise _unsupported(node.op, node)
        return op(self.visit(node.operand))

    def visit_BinOp(self, node: ast.BinOp) -> Number:
        op = _BINARY.get(type(node.op))
        if op is None:
            raise _unsupported(node.op, node)
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        elif isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise ValueError(f"product too large (over {MAX_INT_BITS} bits) in BinOp")
        return _checked(op(left, right))

    def visit_Call(self, node: ast.Call) -> Number:
        if not isinstance(node.func, ast.Name):
            raise _unsupported(node.func, node)
        fn = _FUNCTIONS.get(node.func.id)
        if fn is None:
            raise ValueError(f"unsupported function {node.func.id!r} (Call); allowed: {', '.join(_FUNCTIONS)}")
        if node.keywords:
            raise ValueError(f"keyword arguments are not allowed in {node.func.id}() (keyword)")
        if len(node.args) > _MAX_ARGS:
            raise ValueError(f"{node.func.id}() takes at most {_MAX_ARGS} arguments here")
        args = [self.visit(a) for a in node.args]
        try:
            return _checked(fn(*args))
        except TypeError as exc:
            raise ValueError(f"{node.func.id}(): {exc}") from None

    def generic_visit(self, node: ast.AST) -> Any:
        raise _unsupported(node, node)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_power(base: Number, exponent: Number) -> None:
    if isinstance(exponent, complex) or abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent {exponent!r} exceeds {MAX_EXPONENT} (Pow)")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
        if max(base.bit_length(), 1) * exponent > MAX_INT_BITS + exponent:  # bits of base**exponent, roughly
            raise ValueError(f"power too large (over {MAX_INT_BITS} bits) in Pow")


def _checked(value: Any) -> Number:
    if isinstance(value, complex):  # (-8) ** (1/3) is complex in Python
        raise ValueError(f"complex result {value!r} (Pow): only real numbers are supported")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ValueError(f"integer too large (over {MAX_INT_BITS} bits)")
    return value


def _unsupported(node: ast.AST, context: ast.AST) -> ValueError:
    kind = type(node).__name__
    try:
        text = ast.unparse(context)
    except Exception:  # noqa: BLE001 - unparse is only for the message
        text = "?"
    return ValueError(f"unsupported expression {kind} in {text!r}: only numbers, + - * / // % **, "
                      f"parentheses and {', '.join(_FUNCTIONS)} are allowed")
