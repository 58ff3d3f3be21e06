"""mkdocs hooks for the docs site (``hooks:`` in mkdocs.yml).

The docstrings use Sphinx roles (``:func:`hot_loop```), which mkdocstrings'
Google-style rendering leaves as text (``:func:`` before the code). This hook
drops the role, and links a public name (``jc.X``, ``jaxcontracts.X`` or
``X`` in ``jaxcontracts.__all__``) to its entry in the API reference.
"""

from __future__ import annotations

import re
from typing import Any

import jaxcontracts

_ROLE = re.compile(r":(?:func|class|meth|data|attr|exc|mod|obj):<code>([^<]+)</code>")
_PUBLIC = set(jaxcontracts.__all__)


def _link(match: re.Match[str], api: str) -> str:
    name = match.group(1)
    short = name.removeprefix("jaxcontracts.").removeprefix("jc.")
    if short in _PUBLIC:
        return f'<a href="{api}#jaxcontracts.{short}"><code>{name}</code></a>'
    return f"<code>{name}</code>"


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    """Drop Sphinx roles from rendered docstrings, linking public names."""
    if page.file.src_uri == "api.md":
        api = ""
    else:
        depth = page.url.count("/")  # "guides/state/" -> "../../api/"
        api = "../" * depth + "api/"
    return _ROLE.sub(lambda m: _link(m, api), html)
