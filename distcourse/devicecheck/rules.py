"""The rules of the device check, over the AST of rank code (see the package's doc).

A `Checker` reads the units of one file (a module, or the rank cells of a notebook,
which share one namespace) and returns its `Refusal`s; nothing is run or imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

OPT_OUT = "# devicecheck: host"
# Tensor-taking calls of torch.distributed (object collectives take Python objects).
COLLECTIVES = frozenset(
    (
        "send recv isend irecv P2POp broadcast all_reduce reduce all_gather "
        "all_gather_into_tensor gather scatter reduce_scatter reduce_scatter_tensor "
        "all_to_all all_to_all_single"
    ).split()
)
FACTORIES = frozenset(
    (
        "tensor as_tensor from_numpy zeros ones empty full rand randn randint "
        "randperm arange linspace logspace eye"
    ).split()
)
# Methods whose result lives where their tensor lives.
SAME_DEVICE = frozenset(
    (
        "clone float double half int long view reshape flatten contiguous detach "
        "chunk split tensor_split t unsqueeze squeeze requires_grad_ new_zeros "
        "new_ones new_empty new_full zeros_like ones_like empty_like full_like "
        "rand_like randn_like"
    ).split()
)
DEVICE_TYPE_CALLS = frozenset({"placement", "init_device_mesh", "DeviceMesh", "Mesh"})
DEVICE_TYPE_KEYWORDS = ("type", "device_type")
# Calls that run their first argument, a module, on the rank's tensors.
WRAPPERS = frozenset(
    (
        "DistributedDataParallel DDP ShardedDDP FullyShardedDataParallel fully_shard "
        "parallelize_module parallelize_block parallelize_gpt shard_experts "
        "MixedPrecision ContextGPT"
    ).split()
)
MOVES = frozenset({"to", "cuda", "to_empty"})  # methods that move a module in place
CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})  # children's device
STAYS = frozenset({"float", "double", "half", "bfloat16", "train", "eval"})  # in place


@dataclass(frozen=True)
class Refusal:
    """One finding: where (file, notebook cell, line) and what."""

    path: str
    cell: int | None
    line: int
    message: str

    def __str__(self) -> str:
        cell = "" if self.cell is None else f":cell {self.cell}"
        return f"{self.path}{cell}:{self.line}: {self.message}"


@dataclass(frozen=True)
class HostModule:
    """What a name holds: a module built on the host by `made` (`Block(...)`)."""

    made: ast.Call


@dataclass
class Unit:
    """Code that runs on ranks: a module, or a notebook cell (magic line blanked)."""

    tree: ast.Module
    lines: list[str]
    cell: int | None = None
    only: frozenset[str] | None = None  # check only these functions (spawned code)


def _name(node: ast.AST) -> str | None:
    """The called name: `f` of `f(...)`, `x.f(...)` or `a.b.f(...)`."""
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _short(node: ast.AST, width: int = 40) -> str:
    """The source of `node`, cut to `width` characters."""
    text = ast.unparse(node)
    return text if len(text) <= width else text[: width - 3] + "..."


class Checker:
    """The rules over one file's units, which share names (a notebook's namespace)."""

    def __init__(self, path: str, units: Sequence[Unit]) -> None:
        self.path, self.units = path, units
        self.dist = {"dist"}  # names bound to torch.distributed
        self.aliases = {n: n for n in DEVICE_TYPE_CALLS}  # `as` names of those calls
        self.sinks: dict[str, set[int | str]] = {}  # local function -> its sent args
        self.refusals: list[Refusal] = []

    # ---------------------------------------------------------------- names ------
    def _learn_imports(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "torch.distributed" and a.asname:
                        self.dist.add(a.asname)
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if node.module == "torch" and a.name == "distributed":
                        self.dist.add(a.asname or a.name)
                    if a.name in DEVICE_TYPE_CALLS:
                        self.aliases[a.asname or a.name] = a.name
                    if node.module == "torch.distributed" and a.name in COLLECTIVES:
                        self.sinks[a.asname or a.name] = {0, "tensor"}

    def _collective(self, call: ast.Call) -> bool:
        f = call.func
        if not isinstance(f, ast.Attribute) or f.attr not in COLLECTIVES:
            return False
        base = f.value
        if isinstance(base, ast.Name):
            return base.id in self.dist
        return (
            isinstance(base, ast.Attribute)
            and base.attr == "distributed"
            and isinstance(base.value, ast.Name)
            and base.value.id == "torch"
        )

    def _sent(self, call: ast.Call) -> list[ast.expr]:
        """The arguments of `call` that reach a collective."""
        if self._collective(call):
            return [*call.args, *(k.value for k in call.keywords)]
        wanted = self.sinks.get(_name(call.func) or "", set())
        picked = [a for i, a in enumerate(call.args) if i in wanted]
        return picked + [k.value for k in call.keywords if k.arg in wanted]

    def _learn_sinks(self, tree: ast.AST) -> None:
        """Local functions that pass a parameter straight to a collective."""
        for _ in range(3):  # a function that calls such a function is one too
            for fn in ast.walk(tree):
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
                for call in ast.walk(fn):
                    if not isinstance(call, ast.Call):
                        continue
                    for arg in self._sent(call):
                        for sub in ast.walk(arg):
                            if isinstance(sub, ast.Name) and sub.id in params:
                                found = self.sinks.setdefault(fn.name, set())
                                found |= {params.index(sub.id), sub.id}

    # ------------------------------------------------------------ host tensors ---
    def _host(self, node: ast.expr, bound: dict[str, ast.AST]) -> ast.AST | None:
        """The factory call that makes `node` a device-less tensor, or None."""
        if isinstance(node, ast.Name):
            made = bound.get(node.id)
            return made if not isinstance(made, HostModule) else None
        if isinstance(node, ast.Call):
            name = _name(node.func)
            keywords = {k.arg for k in node.keywords}
            if name in FACTORIES and isinstance(node.func, ast.Attribute):
                is_torch = isinstance(node.func.value, ast.Name) and (
                    node.func.value.id == "torch"
                )
                return node if is_torch and "device" not in keywords else None
            if name in SAME_DEVICE and "device" not in keywords:
                inner = (
                    node.func.value if isinstance(node.func, ast.Attribute) else None
                )
                if name.endswith("_like") and node.args:
                    inner = node.args[0]
                return None if inner is None else self._host(inner, bound)
            if name == "list" and node.args:
                return self._host(node.args[0], bound)
            return None
        if isinstance(node, ast.BinOp):
            return self._host(node.left, bound) or self._host(node.right, bound)
        if isinstance(node, ast.UnaryOp | ast.Subscript | ast.Starred):
            return self._host(
                node.operand if isinstance(node, ast.UnaryOp) else node.value, bound
            )
        if isinstance(node, ast.List | ast.Tuple):
            return next(filter(None, (self._host(e, bound) for e in node.elts)), None)
        if isinstance(node, ast.ListComp):
            return self._host(node.elt, bound)
        if isinstance(node, ast.IfExp):
            return self._host(node.body, bound) or self._host(node.orelse, bound)
        return None

    @staticmethod
    def _module(node: ast.expr, bound: dict) -> ast.Call | None:
        """The class call that built `node` on the host, or None: a capitalised name
        called with no device among its arguments (no `device=`, no name starting
        with `dev`), not a container (whose device is its children's), not moved
        since (`.float()`, `.train()` and the like leave it where it was)."""
        if isinstance(node, ast.Name):
            made = bound.get(node.id)
            return made.made if isinstance(made, HostModule) else None
        if not isinstance(node, ast.Call):
            return None
        name = _name(node.func)
        if name in STAYS and isinstance(node.func, ast.Attribute):
            return Checker._module(node.func.value, bound)
        if not name or not name[:1].isupper() or name in CONTAINERS:
            return None
        values = [*node.args, *(k.value for k in node.keywords)]
        named = [k.arg or "" for k in node.keywords] + [_name(a) or "" for a in values]
        return None if any(n.startswith("dev") for n in named) else node

    def _bind(self, stmt: ast.stmt, bound: dict) -> None:
        """Follow `name = value` (and tuples of them) in source order; a module
        moved in place (`model.to(device)`) is no longer on the host."""
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            f = stmt.value.func
            if isinstance(f, ast.Attribute) and f.attr in MOVES:
                if isinstance(f.value, ast.Name):
                    bound.pop(f.value.id, None)
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                pairs = [(target, stmt.value)]
                if isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple):
                    pairs = list(zip(target.elts, stmt.value.elts, strict=False))
                for name, value in pairs:
                    if isinstance(name, ast.Name):
                        module = self._module(value, bound)
                        made = self._host(value, bound)
                        if module is not None:
                            bound[name.id] = HostModule(module)
                        elif made is None:
                            bound.pop(name.id, None)
                        else:
                            bound[name.id] = made

    # ------------------------------------------------------------------ rules ----
    def _refuse(self, unit: Unit, node: ast.AST, message: str, *more: ast.AST) -> None:
        for n in (node, *more):
            first, last = n.lineno, getattr(n, "end_lineno", None) or n.lineno
            if any(OPT_OUT in unit.lines[i - 1] for i in range(first, last + 1)):
                return
        self.refusals.append(Refusal(self.path, unit.cell, node.lineno, message))

    def _check_call(self, unit: Unit, call: ast.Call, bound: dict) -> None:
        for arg in self._sent(call):
            made = self._host(arg, bound)
            if made is not None:
                message = (
                    f"{_short(call.func)}() gets {_short(arg)}, a host tensor made by "
                    f"{_short(made)}: NCCL takes only tensors on the rank's GPU; "
                    "make it with device=device or move it with .to(device)"
                )
                self._refuse(unit, call, message, made)
        wrapper = _name(call.func)
        module = self._module(call.args[0], bound) if call.args else None
        if wrapper in WRAPPERS and module is not None:
            message = (
                f"{wrapper}() gets {_short(call.args[0])}, a module built on the host "
                f"by {_short(module)}: on a GPU rank it meets the rank's tensors "
                "('Expected all tensors to be on the same device'); "
                "move it first with .to(device)"
            )
            self._refuse(unit, call, message, module)
        called = self.aliases.get(_name(call.func) or "")
        if called is None:
            return
        given = [k.value for k in call.keywords if k.arg in DEVICE_TYPE_KEYWORDS]
        if called in ("placement", "init_device_mesh", "DeviceMesh") and call.args:
            given.append(call.args[0])
        keywords = {k.arg for k in call.keywords}
        if called == "placement" and not given and "mesh" not in keywords:
            message = (
                "placement() without a device type is on the CPU; pass device.type"
            )
            self._refuse(unit, call, message)
        for value in given:
            if isinstance(value, ast.Constant) and value.value == "cpu":
                self._refuse(
                    unit,
                    call,
                    f'{called}("cpu", ...): a literal "cpu" '
                    "where the rank's device is meant; pass device.type",
                )

    def _walk(self, unit: Unit, body: list[ast.stmt], bound: dict) -> None:
        """Statements in source order; a function body gets its own names."""
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                if unit.only is None or stmt.name in unit.only:
                    self._walk(Unit(unit.tree, unit.lines, unit.cell), stmt.body, {})
                continue
            if isinstance(stmt, ast.ClassDef):
                self._walk(unit, stmt.body, bound)
                continue
            if unit.only is None:
                for node in self._own_nodes(stmt):
                    if isinstance(node, ast.Call):
                        self._check_call(unit, node, bound)
                self._bind(stmt, bound)
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(stmt, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.AST):
                    self._walk(unit, inner, bound)

    @staticmethod
    def _own_nodes(stmt: ast.stmt) -> Iterator[ast.AST]:
        """The nodes of `stmt` outside its nested statement bodies."""
        todo = [c for c in ast.iter_child_nodes(stmt) if not isinstance(c, ast.stmt)]
        while todo:
            node = todo.pop()
            yield node
            todo += [
                c for c in ast.iter_child_nodes(node) if not isinstance(c, ast.stmt)
            ]

    def run(self) -> list[Refusal]:
        for unit in self.units:
            self._learn_imports(unit.tree)
        for unit in self.units:
            self._learn_sinks(unit.tree)
        bound: dict[str, ast.AST] = {}  # shared: a notebook's cells share names
        for unit in self.units:
            self._walk(unit, unit.tree.body, bound)
        return sorted(set(self.refusals), key=lambda r: (r.cell or 0, r.line))
