"""The API reference's own rules (issue 77), as a Sphinx extension of the book:

* every public name the reference documents has a docstring: one without is a warning, and the book
  builds with warnings as errors, so the build fails on it;
* a configuration field (:class:`fedlib.config.Config`) is documented by its help text, the one the
  command line shows (``Config``'s field metadata): one source for both.
"""

from __future__ import annotations

import dataclasses

from sphinx.util import logging

logger = logging.getLogger(__name__)

#: The kinds of documented object that must carry a docstring.
DOCUMENTED = ("module", "class", "exception", "function", "method", "property", "attribute", "data")


def _config_help(name: str) -> str | None:
    from fedlib.config import Config

    field = name.rpartition(".")[2]
    for f in dataclasses.fields(Config):
        if f.name == field and name.startswith("fedlib.config.Config."):
            return f"{f.metadata.get('help', '')} (default: ``{f.default!r}``)"
    return None


def check_docstring(app, what, name, obj, options, lines) -> None:
    if what not in DOCUMENTED or name.rpartition(".")[2].startswith("_"):
        return
    if not any(line.strip() for line in lines):
        helptext = _config_help(name)
        if helptext:
            lines[:] = [helptext]
            return
        logger.warning(f"{name} has no docstring: every public name of the API reference needs one",
                       type="fedlib", subtype="undocumented")


def setup(app):
    app.connect("autodoc-process-docstring", check_docstring)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
