"""Edits of one call's arguments: the DataLoader's, the optimizer's, ``zero_grad``'s, a conv's, ``torch.tensor``,
``torch.compile``'s."""

from __future__ import annotations

from typing import Callable

import libcst as cst

from ..cst_tools import Source, code_of, dotted, keyword_value, replace, set_keyword
from .model import ByHand, EditRequest

__all__ = ["loader", "optimizer", "zero_grad", "conv_bias", "from_numpy", "ddp", "fsdp", "threads", "compile_call"]

# Where an argument sits when passed positionally (torch's own signatures), so `DataLoader(ds, 32, True,
# None, None, 0)` has its 0 replaced rather than a second num_workers added.
_LOADER_POSITION = {"num_workers": 5, "pin_memory": 7}
_CONV_BIAS_POSITION = 7


def _one_call(source: Source, req: EditRequest, call: cst.Call, new: cst.Call) -> str:
    if new.deep_equals(call):
        raise ByHand(f"{req.where}: `{code_of(call)}` already has the fix")
    return replace(source, {call: lambda _: new})


def loader(source: Source, req: EditRequest) -> str:
    """``DataLoader(..., num_workers=N, persistent_workers=True)`` / ``pin_memory=True`` at the loader's line; a
    keyword the loader takes through its function's ``**kwargs`` is set where that function is called."""
    call = source.call_at(req.line, "DataLoader", what="DataLoader(...)")
    new: dict[cst.Call, cst.Call] = {}
    for name, value in req.params.items():
        target, where = _keyword_home(source, call, name, _LOADER_POSITION.get(name)) or (call, req.where)
        try:
            new[target] = set_keyword(new.get(target, target), name, repr(value), _LOADER_POSITION.get(name), where)
        except ByHand as exc:
            arg = keyword_value(target, name)
            option = source.command_line_option(arg.value) if arg is not None else None
            if option is None:
                raise
            raise ByHand(f"{exc}, or run the script with {option.flag} {value!r} ({option.said})") from exc
    if all(n.deep_equals(c) for c, n in new.items()):
        raise ByHand(f"{req.where}: `{code_of(call)}` already has the fix")
    return replace(source, {c: _becomes(n) for c, n in new.items()})


def _keyword_home(source: Source, call: cst.Call, name: str, position: int | None) -> tuple[cst.Call, str] | None:
    """Where ``name`` is given to ``call`` that takes it from its function's ``**kwargs`` and does not name it:
    the one call of that function in the file (of its class, for an ``__init__``), with its place; None otherwise
    (the keyword is then set on ``call`` itself, or said to be by hand). The function must pass its ``**kwargs`` on
    untouched (the name used once, in this call) and not take ``name`` as a parameter of its own."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if keyword_value(call, name) is not None or (position is not None and len(positional) > position):
        return None
    function = source.function_of(call)
    star = function.params.star_kwarg if function is not None else None
    spread = [a.value for a in call.args if a.star == "**"]
    if function is None or star is None or len(spread) != 1:
        return None
    if not isinstance(spread[0], cst.Name) or spread[0].value != star.name.value:
        return None
    own = [p.name.value for p in (*function.params.params, *function.params.kwonly_params)]
    uses = [
        n
        for n in source.nodes(cst.Name)
        if n.value == star.name.value and n is not star.name and source.function_of(n) is function
    ]
    if name in own or len(uses) != 1:
        return None
    callee_name = function.name.value
    if callee_name == "__init__":
        owner = next((a for a in source.ancestors(function) if isinstance(a, cst.ClassDef)), None)
        if owner is None:
            return None
        callee_name = owner.name.value
    elif any(isinstance(a, (cst.ClassDef, cst.FunctionDef)) for a in source.ancestors(function)):
        return None  # a method or a nested function: its calls are not found by name
    callers = [c for c in source.nodes(cst.Call) if dotted(c.func) == callee_name]
    if len(callers) != 1:
        return None
    return callers[0], f"{source.name}:{source.lines(callers[0])[0]}"


def optimizer(source: Source, req: EditRequest) -> str:
    """``fused=True`` (or ``foreach=True``) in the optimizer's constructor; ``foreach=False`` gives way to
    ``fused=True`` in place, since torch refuses both set to True."""
    cls, switch = req.params["class"], req.params["switch"]
    call = source.call_at(req.line, cls, what=f"{cls}(...)")
    other = keyword_value(call, "foreach") if switch == "fused" else None
    if other is not None and code_of(other.value) in ("False", "None"):
        new = call.with_deep_changes(other, keyword=cst.Name("fused"), value=cst.Name("True"))
    else:
        try:
            new = set_keyword(call, switch, "True", None, req.where)
        except ByHand as exc:
            raise ByHand(f"{exc}{_where_set(source, keyword_value(call, switch))}") from exc
    return _one_call(source, req, call, new)


def _where_set(source: Source, arg: cst.Arg | None) -> str:
    """``"; use_fused is set at train.py:260: `use_fused = ...`"`` where ``arg``'s value is a name assigned once in
    its function; "" otherwise."""
    if arg is None or not isinstance(arg.value, cst.Name):
        return ""
    assign = source.one_assignment(arg.value)
    if assign is None:
        return ""
    return f"; {arg.value.value} is set at {source.name}:{source.lines(assign)[0]}: `{code_of(assign).strip()}`"


def zero_grad(source: Source, req: EditRequest) -> str:
    """``zero_grad(set_to_none=True)``: gradients dropped, not filled with zeros."""
    call = source.call_at(req.line, "zero_grad", what="zero_grad(...)")
    return _one_call(source, req, call, set_keyword(call, "set_to_none", "True", 0, req.where))


def conv_bias(source: Source, req: EditRequest) -> str:
    """``bias=False`` in each convolution a BatchNorm follows (its mean subtraction cancels the bias)."""
    names = tuple(req.params["classes"])
    edits: dict[cst.CSTNode, Callable[[cst.CSTNode], object]] = {}
    for line in (req.line, *req.lines):
        calls = [c for c in source.calls_at(line, *names) if source.lines(c)[0] == line] or source.calls_at(
            line, *names
        )
        if not calls:
            raise ByHand(f"no {'/'.join(names)}(...) call at {source.name}:{line}")
        for call in calls:
            new = set_keyword(call, "bias", "False", _CONV_BIAS_POSITION, f"{source.name}:{line}")
            if not new.deep_equals(call):
                edits[call] = (lambda made: lambda _: made)(new)
    if not edits:
        raise ByHand(f"{req.where}: the convolutions already have bias=False")
    return replace(source, edits)


_AS_TENSOR_KEYWORDS = {"dtype", "device"}


def from_numpy(source: Source, req: EditRequest) -> str:
    """``torch.from_numpy(a)`` for ``torch.tensor(a)`` of a NumPy array (``torch.as_tensor(a, dtype=...)`` when
    a dtype or device is given): the tensor shares the array's memory instead of copying it."""
    torch_name = source.alias_of("torch") or "torch"
    calls = [c for c in source.calls_at(req.line, "tensor") if dotted(c.func) == f"{torch_name}.tensor"]
    if not calls:
        raise ByHand(f"no torch.tensor(...) call at {req.where}")
    call = calls[0]
    positional = [a for a in call.args if a.keyword is None]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    if len(positional) != 1 or positional[0].star or keywords - _AS_TENSOR_KEYWORDS:
        raise ByHand(
            f"{req.where}: `{code_of(call)}` passes {', '.join(sorted(keywords - _AS_TENSOR_KEYWORDS))}"
            " or more than the array; torch.as_tensor(array, ...) takes only dtype and device"
        )
    func = call.func
    name = "as_tensor" if keywords else "from_numpy"
    new_func = func.with_changes(attr=cst.Name(name))
    args = call.args if keywords else [positional[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)]
    return _one_call(source, req, call, call.with_changes(func=new_func, args=args))


def ddp(source: Source, req: EditRequest) -> str:
    """``DistributedDataParallel(model, ..., find_unused_parameters=False)``: the keywords timed on every rank."""
    # The names the file calls it by: its own, the usual DDP, and any other it is imported as.
    imported = (
        source.alias_of(f"{m}.DistributedDataParallel") for m in ("torch.nn.parallel", "torch.nn.parallel.distributed")
    )
    names = {"DistributedDataParallel", "DDP", *filter(None, imported)}
    call = source.call_at(req.line, *sorted(names), what="DistributedDataParallel(...)")
    return _one_call(source, req, call, _with_keywords(call, req))


def _with_keywords(call: cst.Call, req: EditRequest) -> cst.Call:
    """``call`` with each of the request's ``keywords`` set (added, or its value replaced)."""
    for name, value in req.params["keywords"].items():
        call = set_keyword(call, name, repr(value), None, req.where)
    return call


def fsdp(source: Source, req: EditRequest) -> str:
    """``fully_shard(module, ..., reshard_after_forward=False)`` in every call of the file that leaves the keyword
    to FSDP: the what-if forced it on every call, so the edit does too (a call that sets it is the script's choice).
    """
    forced = req.params["keywords"]
    calls = [
        call
        for call in source.nodes(cst.Call)
        if dotted(call.func).split(".")[-1] == "fully_shard" and not any(keyword_value(call, k) for k in forced)
    ]
    if not calls:
        fsdp1 = ("FullyShardedDataParallel", "FSDP")
        older = [c for c in source.nodes(cst.Call) if dotted(c.func).split(".")[-1] in fsdp1]
        if older and forced.get("reshard_after_forward") is False:
            # Its value needs an import the script may not have: the line is named, the edit is yours.
            raise ByHand(
                f"{req.where}: FullyShardedDataParallel(..., sharding_strategy=ShardingStrategy.SHARD_GRAD_OP), "
                "with `from torch.distributed.fsdp import ShardingStrategy`"
            )
        raise ByHand(f"{req.where}: no fully_shard(...) call without {', '.join(forced)} in {source.name}")
    edits: dict[cst.CSTNode, Callable[[cst.CSTNode], object]] = {}
    for call in calls:
        new = call
        for name, value in forced.items():
            new = set_keyword(new, name, repr(value), None, req.where)
        edits[call] = _becomes(new)
    return replace(source, edits)


def _becomes(new: cst.Call) -> Callable[[cst.CSTNode], object]:
    return lambda _old: new


def threads(source: Source, req: EditRequest) -> str:
    """``torch.set_num_threads(N)``: the script's own call given the count timed on every rank; where the line is
    the ``def`` of the function spawned ranks run (and the script sets no count), a call as its first statement."""
    function = next((f for f in source.nodes(cst.FunctionDef) if source.lines(f.name)[0] == req.line), None)
    if function is None or source.calls_at(req.line, "set_num_threads"):
        call = source.call_at(req.line, "set_num_threads", what="torch.set_num_threads(...)")
        return _one_call(source, req, call, set_keyword(call, "int", repr(req.params["threads"]), 0, req.where))
    torch = source.alias_of("torch")
    if torch is None:
        raise ByHand(f"{req.where}: the file does not import torch; call torch.set_num_threads(N) first in each rank")
    line = cst.parse_statement(f"{torch}.set_num_threads({req.params['threads']!r})\n")
    if not isinstance(function.body, cst.IndentedBlock):
        raise ByHand(f"{req.where}: a one-line function; call {torch}.set_num_threads(N) first in it")
    first = function.body.body[0]
    docstring = (
        isinstance(first, cst.SimpleStatementLine)
        and isinstance(first.body[0], cst.Expr)
        and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
    if docstring:  # after the docstring, which stays the function's first statement
        return replace(source, {first: lambda node: cst.FlattenSentinel([node, line])})
    return replace(source, {first: lambda node: cst.FlattenSentinel([line, node])})


def compile_call(source: Source, req: EditRequest) -> str:
    """``torch.compile(model, ..., dynamic=True)`` (or ``model.compile(...)``, ``@torch.compile(...)``): the keywords
    at the compile call; a bare ``@torch.compile`` decorator becomes a call with them."""
    bare = next(
        (
            d
            for d in source.nodes(cst.Decorator)
            if source.lines(d)[0] == req.line and dotted(d.decorator).split(".")[-1] == "compile"
        ),
        None,
    )
    if bare is not None:
        called = cst.Call(func=bare.decorator)
        return replace(source, {bare.decorator: lambda _: _with_keywords(called, req)})
    call = source.call_at(req.line, "compile", what="torch.compile(...)")
    return _one_call(source, req, call, _with_keywords(call, req))
