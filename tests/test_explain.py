"""``python -m jaxcontracts explain`` and ``jc.explain``: the errors page, offline,
from the installed package (issue 53)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import jaxcontracts as jc
from jaxcontracts._errors import CONTRACTS, VIOLATIONS

ERRORS = [jc.ContractError, jc.DefinitionError, jc.SpecError, jc.RecompileError, jc.DonationError, jc.TransferError]


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_every_error_class_has_its_section_and_every_message_points_to_it(cls):
    text = str(jc.explain(cls.__name__))
    assert text.splitlines()[0] == cls.__name__ and len(text.splitlines()) > 3
    err = cls("summary")
    assert str(err).splitlines()[-1] == f"See: python -m jaxcontracts explain {cls.__name__}"
    assert str(jc.explain(err)) == text  # the error itself, as a notebook passes it


@pytest.mark.parametrize("name", [*VIOLATIONS, *CONTRACTS, "kept-reference", "tracebacks", "capabilitywarning"])
def test_every_violation_kind_and_contract_key_leads_to_a_section(name):
    heading = str(jc.explain(name)).splitlines()[0]
    kind = VIOLATIONS.get(name)
    contract = CONTRACTS.get(kind.contract if kind is not None else name)
    if contract is not None and contract.key == "donation-config":  # a section of its own
        assert heading == "Plain jax.jit donations" and "donate_argnames" in str(jc.explain(name))
    elif contract is not None:  # its error class's section
        assert heading == contract.error.__name__
    else:
        assert heading in ("Kept references", "Tracebacks end at your line", "CapabilityWarning")


@pytest.mark.parametrize("kind", [k for c in CONTRACTS.values() for k in c.findings])
def test_every_audit_finding_kind_leads_to_its_contracts_section(kind):
    # the audit prints host_sync, host_transfer, recompile, compile_in_loop...: each
    # leads where the contract it breaks is explained (hostile round 64: four did not)
    (contract,) = [c for c in CONTRACTS.values() if kind in c.findings]
    heading = str(jc.explain(kind)).splitlines()[0]
    assert heading == str(jc.explain(contract.key)).splitlines()[0]
    assert kind in jc._explain.topics()


def test_help_of_the_explain_and_info_commands_is_no_error(capsys):
    from jaxcontracts import _explain, _info

    assert _explain.main(["--help"]) == 0 and "explain NAME" in capsys.readouterr().out
    assert _explain.main([]) == 2
    assert _info.main(["--help"]) == 0 and "takes no arguments" in capsys.readouterr().out


def test_a_raised_violation_leads_to_its_fix():
    with pytest.raises(jc.TransferError) as info, jc.hot_loop():
        float(jc.device_tree({"x": 1.0})["x"])
    explained = str(jc.explain(info.value))
    assert "jc.fetch(x)" in explained and explained.startswith("TransferError")
    assert "Kept references" in str(jc.explain("DonationError"))  # a section holds its subsections


def test_an_unknown_name_lists_what_there_is():
    with pytest.raises(KeyError, match="the errors page explains: .*DonationError.*kept-reference.*transfer"):
        jc.explain("nope")


def test_in_a_notebook_it_renders_as_markdown_without_links():
    md = jc.explain("TransferError")._repr_markdown_()
    assert md.startswith("## TransferError") and "](" not in md


def test_the_command_prints_the_section_offline_and_says_what_it_takes():
    run = [sys.executable, "-m", "jaxcontracts", "explain"]
    proc = subprocess.run([*run, "DonationError"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("DonationError\n\nA buffer was not donated")
    assert "{#" not in proc.stdout and "](" not in proc.stdout  # plain text: no anchors, no links
    proc = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "explain NAME, where NAME is one of:" in proc.stdout
    assert "  kept-reference\n" in proc.stdout
    proc = subprocess.run([*run, "nope"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no section on 'nope'" in proc.stdout


def test_the_command_whose_reader_has_gone_ends_quietly():
    # `python -m jaxcontracts explain DonationError | head -1`, head gone before the
    # page is written: no BrokenPipeError traceback
    with subprocess.Popen(
        [sys.executable, "-m", "jaxcontracts", "explain", "DonationError"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:
        proc.stdout.close()
        err = proc.stderr.read()
        rc = proc.wait(timeout=120)
    assert rc == 0 and "BrokenPipeError" not in err, err
