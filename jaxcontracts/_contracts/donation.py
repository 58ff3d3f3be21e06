"""Every state buffer donated, and no donated array used again: the
donation is verified in the executable (aliasing, at compile), no donated
buffer is stale, passed twice or held elsewhere (before the call), XLA
consumed each donated input (after it, at ``full``), and inside a loop no
donated array is used and no ``jax.jit`` donation is wrong or missed. The
fixes for a donated array are worded here once (:data:`DONATION_FIXES`).
"""

from __future__ import annotations

from typing import Any

from .. import _steps
from .._errors import Contract, DonationError, declare

__all__ = ["DONATION_FIXES", "donation_fix"]


def _aliased(cs: Any, stats: Any) -> tuple[bool, str, str, str]:
    """Each donated leaf aliased to an output in the executable's alias table."""
    missing = [leaf.path for leaf in cs.leaves if leaf.donated and leaf.aliased is False]
    unverified = bool(cs.donated) and cs.aliased is None
    detail = (
        "not aliased: " + ", ".join(missing) if missing
        else "not verified: the executable's alias table could not be read" if unverified
        else ""
    )  # fmt: skip
    return not missing and not unverified, detail, f" ({len(cs.donated)} leaves donated)", ""


def _consumed(cs: Any, stats: Any) -> tuple[bool, str, str, str]:
    """Each donated input deleted after the call (looked at on calls at checks level full)."""
    looked = stats.consumed_checked
    detail = (
        f"{stats.not_consumed} call(s) where XLA copied instead" if stats.not_consumed
        else f"{looked} of {stats.calls} calls looked at (checks level full)"
        if cs.donated and 0 < looked < stats.calls
        else ""
    )  # fmt: skip
    why = "" if not cs.donated or looked else "no call was made at checks level full"
    return stats.not_consumed == 0, detail, "", why


declare(
    Contract("aliasing", "donation verified in the executable", DonationError, verdict=_aliased)
)
declare(Contract("donation-hazard", "no donated buffer is stale or passed twice", DonationError))
declare(
    Contract(
        "consumed",
        "every donated input consumed (XLA did not copy)",
        DonationError,
        verdict=_consumed,
    )
)
declare(
    Contract(
        "no-donated-use", "no use of donated arrays", DonationError,
        violations=(("donation", "use of a donated array inside jc.hot_loop"),),
    )
)  # fmt: skip
declare(
    Contract(
        "donation-config",
        "jax.jit donations: each one possible, none missed where the caller drops the buffer",
        DonationError,
        violations=(
            ("wrong_donation", "a donation that cannot happen, inside jc.hot_loop"),
            ("missed_donation", "a missed donation, inside jc.hot_loop"),
        ),
        findings=("wrong_donation", "missed_donation"),
    )
)

# Every fix for a use of a donated array, in one table: each message that says
# "donated" (``_runtime.donated``) ends with one of these. {returned}: see donation_fix().
_KEEP = (
    "To keep a value across a donating call, copy it before the call "
    "(kept = jnp.copy({value})), or return it as an output of its own."
)
# the first advice for a donated array something else still holds
_KEEP_COPY = (
    "keep a copy instead of the array itself (samples.append(jnp.copy({value})), or "
    "jc.fetch({value}) for a host copy)"
)
DONATION_FIXES = {
    # an array of a donated state was used, read or pickled
    "use": "use {returned}). " + _KEEP,
    # a field of a consumed jc.state was read
    "read": "read {returned}; s.{value}). " + _KEEP.replace("{value}", "s.{value}")
    + " Or leave the field out of donate=.",
    # jc.fetch of a donated array
    "fetch": "fetch from {returned}; jc.fetch({value})). " + _KEEP,
    # a call was passed a donated array, or one buffer twice
    "pass": "pass {returned}), not the one you passed to it. "
    + _KEEP
    + " Where one array must appear twice, pass a copy (jnp.copy(x)).",
    # one buffer in two leaves of a call, none of them deleted
    "twice": "build the state with a copy where one array appears twice ({value}): XLA cannot "
    "donate one buffer for two leaves, nor keep one leaf of it while donating the other.",
    # a call was passed a deleted array that this step does not donate (a batch a jax.jit donated)
    "pass_other": "pass an array that still exists: {value} was deleted before this call "
    "(donated to an earlier call, such as a jax.jit with donate_argnums, or x.delete()); "
    "pass what that call returned in its place. " + _KEEP,
    # a donated leaf is still referenced besides its state
    "kept": _KEEP_COPY + ", return what you keep as an output of its own, "
    "or drop the other reference (del x; del err for a kept exception, or call the step after "
    "the except block; build the state on a line of its own, not inside the call or an assert: "
    "s = s._replace(lr=lr), then s = step(s)); to donate nothing, @jc.hot_step(donate=\"none\").",
    # a container of donated leaves inside a state is still referenced besides its state
    "kept_node": "keep a copy instead of the container itself "
    "(samples.append(jax.tree.map(jnp.copy, {value})), or jc.fetch({value}) for a host copy), "
    "return what you keep as an output of its own, or drop the other reference "
    "(a variable that still names it, such as the params you "
    'built a TrainState from: del params); to donate nothing, @jc.hot_step(donate="none").',
}


def donation_fix(kind: str, by: str | None = None, value: str = "value") -> str:
    """The fix of :data:`DONATION_FIXES` for ``kind``, naming ``value`` and the
    step whose returned state to use: ``by`` (the consumer, where known), else
    the one live step that donates, else "the step"."""
    steps = [by] if by else _steps.donating()
    if len(steps) == 1:
        returned = f"the state {steps[0]} returned (s = {steps[0]}(s)"
    else:
        returned = "the state the step returned (s = step(s)"
    return DONATION_FIXES[kind].format(returned=returned, value=value)
