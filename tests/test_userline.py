"""The line a hot loop's message points to is the user's, past installed packages' frames.

A read deep inside a third-party library (a module under ``site-packages``)
is reported at the user's call into it, quoted, and the library's file is
not named.
"""

from __future__ import annotations

import sys
import textwrap

import jax.numpy as jnp
import pytest

import jaxcontracts as jc


def test_messages_point_past_installed_packages_to_the_users_line(tmp_path, monkeypatch):
    site = tmp_path / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "fakesim.py").write_text(
        textwrap.dedent(
            """
            def check_overflow(flag):
                if flag:  # a read deep inside a third-party library
                    return True
                return False
            """
        )
    )
    monkeypatch.syspath_prepend(str(site))
    import fakesim

    flag = jnp.bool_(False)
    try:
        with pytest.raises(jc.TransferError) as e, jc.hot_loop():
            fakesim.check_overflow(flag)
    finally:
        sys.modules.pop("fakesim", None)
    assert "test_userline.py" in str(e.value) and "fakesim.check_overflow(flag)" in str(e.value)
    assert "fakesim.py" not in str(e.value)
