"""Strict settings for the whole suite: 8 simulated CPU devices, warnings fatal."""

import os

# Must happen before jax is imported anywhere.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

import jaxcontracts as jc  # noqa: E402

if jax.default_backend() != "cpu":
    # The suite runs on an accelerator (JAX_PLATFORMS set to it): this process
    # holds the chip, which a second process cannot open (a TPU's libtpu lock).
    # The processes tests start (pytester runs, the audit CLI, the demo, the
    # examples) run on the CPU.
    os.environ["JAX_PLATFORMS"] = "cpu"


def _import_the_package() -> None:
    """pytester's in-process runs (test_pytest_plugin) take out of sys.modules
    every module first imported inside them: a module of the package that
    was not imported yet would be imported again later, a second copy with
    state of its own (ArrayImpl's patch records, the guard's), and the tests
    after it would depend on their order. So the whole package is imported
    once, first (the demo aside: its modules define steps)."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(jc.__path__, "jaxcontracts."):
        if not info.name.startswith("jaxcontracts.demo") and not info.name.endswith("__main__"):
            importlib.import_module(info.name)


_import_the_package()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "cpu_only(reason): what the test checks exists on JAX's CPU backend only (skipped elsewhere, saying why)",
    )



@pytest.fixture(autouse=True)
def _full_checks():
    """Every test starts at the default checks level and leaves it there."""
    jc.set_checks("full")
    yield
    jc.set_checks("full")


@pytest.fixture
def mesh2():
    """A 1-D mesh over two CPU devices."""
    from jax.sharding import Mesh

    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count>=2")
    import numpy as np

    return Mesh(np.array(devices[:2]), ("x",))


def _a_view_blocks_donation() -> bool:
    """Whether a live numpy view of a CPU array makes XLA copy instead of
    donating it (jaxlib up to 0.12.0; 0.12.1 donates past it)."""
    import jax.numpy as jnp
    import numpy as np

    x = jnp.ones(3) + 1
    view = np.asarray(x)
    jax.jit(lambda a: a * 2, donate_argnums=0)(x)
    del view
    return not x.is_deleted()


@pytest.fixture
def without_kept_check(monkeypatch):
    """As if the kept-references capability were missing (a reference the
    refcount cannot see, such as jaxlib 0.11.2's pinned host view): a
    donated leaf held elsewhere reaches XLA, which copies instead of donating,
    and the after-call consumption check is what catches it. The tests make
    XLA copy with a numpy view: where the installed jaxlib donates past one,
    nothing here can make it copy, and they are skipped."""
    from jaxcontracts._compat import refcount

    if not _a_view_blocks_donation():
        pytest.skip(f"jaxlib {jax.__version__} donates past a live numpy view: no undonated call to check")
    monkeypatch.setattr(refcount, "available", lambda: False)


# The longest contract-error message the suite produced (issue 21: messages are
# bounded): every ContractError built during the run is measured, and the
# terminal summary names the longest and the test that made it.
_longest = {"lines": 0, "test": "", "error": ""}
_current_test = {"id": ""}
_original_init = jc.ContractError.__init__


def _measuring_init(self, *args, **kwargs):
    _original_init(self, *args, **kwargs)
    lines = str(self).count("\n") + 1
    if lines > _longest["lines"]:
        _longest.update(lines=lines, test=_current_test["id"], error=type(self).__name__)


jc.ContractError.__init__ = _measuring_init


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _current_test["id"] = item.nodeid
    marker = item.get_closest_marker("cpu_only")
    if marker is not None and jax.default_backend() != "cpu":
        pytest.skip(f"CPU only: {marker.args[0]}")


def pytest_terminal_summary(terminalreporter):
    if _longest["lines"]:
        terminalreporter.write_line(
            f"longest contract-error message: {_longest['lines']} lines "
            f"({_longest['error']}, {_longest['test']})"
        )
