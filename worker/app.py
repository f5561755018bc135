"""Loading the user's app from its `module:callable` spec.

The worker does this after its bootstrap, and `sockherd check` does it in the
checking process, the same way: optional chdir, directories put first on
sys.path, import, then the attribute path. Any failure is an AppImportError
whose message names the spec and the cause, with the cause chained (the
traceback of an exception inside the app's own import is what its author needs).
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback


class AppImportError(Exception):
    """The app could not be imported or is not what the spec names."""


def cause_traceback(exc: BaseException) -> str:
    """The traceback of what the app's import raised, as an operator reads
    it: the app's own frames (and a SyntaxError's caret), without the
    import machinery's (importlib's frozen modules, import_app itself),
    which say nothing about the app and push its frames off the screen."""
    te = traceback.TracebackException.from_exception(exc)
    machinery = (importlib.__file__, __file__)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if not f.filename.startswith("<frozen importlib")
         and f.filename not in machinery])
    return "".join(te.format())


def _call_of(spec: str) -> tuple[str, tuple | None]:
    """("module:attr", its literal call arguments) of a `module:factory(...)`
    spec (gunicorn's), or (spec, None): not a call."""
    import ast

    if not spec.endswith(")") or "(" not in spec:
        return spec, None
    head, _, args = spec.partition("(")
    try:
        call = ast.parse(f"f({args}", mode="eval").body
        if call.keywords:
            raise ValueError("keyword arguments")
        return head, tuple(ast.literal_eval(a) for a in call.args)
    except (SyntaxError, ValueError) as exc:
        raise AppImportError(f"app {spec!r}: the factory's arguments must be Python literals "
                             f"({exc})") from None


def import_app(spec: str, *, chdir: str = "", pythonpath: list[str] | tuple = (),
               factory: bool = False) -> object:
    """Returns the object `spec` ("package.module:attr.attr") names; with
    `module:factory(args)` or factory=True (uvicorn's --factory), what that
    callable returns when called (with the literal args, or none)."""
    spec_text = spec
    spec, args = _call_of(spec)
    if factory and args is None:
        args = ()
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise AppImportError(f"app {spec!r}: expected module:callable")
    if chdir:
        try:
            os.chdir(chdir)
        except OSError as exc:
            raise AppImportError(f"app {spec!r}: cannot change to {chdir!r}: {exc.strerror}") from None
    # pythonpath first, then the working directory, as gunicorn does
    for entry in reversed([*pythonpath, os.getcwd()]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise AppImportError(f"app {spec!r}: no module named {exc.name!r} "
                                 f"(sys.path[0] is {sys.path[0]!r})") from None
        raise AppImportError(f"app {spec!r}: importing {module_name!r} failed: {exc!r}") from exc
    except (Exception, SystemExit) as exc:  # the app's own import code: anything can happen
        raise AppImportError(f"app {spec!r}: importing {module_name!r} failed: {exc!r}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppImportError(f"app {spec!r}: {module_name!r} has no attribute path "
                                 f"{attr_path!r} (missing {part!r})") from None
    if args is not None:
        if not callable(obj):
            raise AppImportError(f"app {spec_text!r}: the factory is a {type(obj).__name__}, "
                                 f"not callable")
        try:
            obj = obj(*args)
        except (Exception, SystemExit) as exc:   # the app's own code
            raise AppImportError(f"app {spec_text!r}: calling the factory failed: "
                                 f"{exc!r}") from exc
    if not callable(obj):
        what = "the factory returned a" if args is not None else ""
        raise AppImportError(f"app {spec_text!r}: {what}{' ' if what else ''}"
                             f"{type(obj).__name__} object is not callable")
    return obj
