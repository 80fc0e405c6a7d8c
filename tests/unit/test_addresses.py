"""The recipient's counting form (notifyqueue/addresses.py): spellings that reach one mailbox
share one form, spellings that reach different ones never do, and nothing raises."""

import pytest

from notifyqueue.addresses import recipient_key

ONE_MAILBOX = [
    "ada@bücher.example",
    "Ada@Bücher.Example",
    "ADA@BÜCHER.EXAMPLE",
    "ada@xn--bcher-kva.example",
    "ADA@XN--BCHER-KVA.EXAMPLE",
    "ada@bücher.example.",  # the root's dot
    "ada@bu\u0308cher.example",  # u + combining diaeresis (NFKC composes it)
    "\uff41\uff44\uff41@bücher.example",  # full-width letters
    "ada\uff20bücher.example",  # full-width @
]


def test_spellings_of_one_mailbox_have_one_counting_form():
    assert {recipient_key("email", s) for s in ONE_MAILBOX} == {"ada@xn--bcher-kva.example"}


def test_compatibility_forms_and_case_folding_apply_to_the_local_part():
    assert recipient_key("email", "\ufb00ion@example.com") == "ffion@example.com"  # ligature
    assert recipient_key("email", "STRASSE@example.com") == recipient_key(
        "email", "straße@example.com"
    )


def test_a_domain_with_sharp_s_is_not_the_domain_spelled_with_ss():
    """IDNA 2008: `straße.de` and `strasse.de` are two registrable domains; IDNA 2003 (the
    standard library's codec), or folding case before the mapping, merged them."""
    assert recipient_key("email", "x@straße.de") == "x@xn--strae-oqa.de"
    assert recipient_key("email", "x@STRASSE.de") == "x@strasse.de"


@pytest.mark.parametrize("channel", ["sms", "push", "in_app"])
def test_other_channels_count_the_recipient_as_given(channel):
    assert recipient_key(channel, "AbC-Token+15550000001") == "AbC-Token+15550000001"


@pytest.mark.parametrize("address", ["no-at-sign", "x@ex..com", "x@-bad-.com", "x@\u0301.com"])
def test_an_address_idna_refuses_still_has_a_form(address):
    assert recipient_key("email", address) == recipient_key("email", address.upper())
