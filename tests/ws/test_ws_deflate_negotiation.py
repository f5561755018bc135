"""permessage-deflate's negotiation (RFC 7692 section 7.1) as
worker/native/proto/ws/ws_deflate.c decides it, no I/O: the Sec-WebSocket-Extensions
values of a handshake (one per header field, in order) in, the 101's value
out (None: nothing accepted). Offers are tried in the client's order; one
with an unknown, duplicate, or invalid parameter is declined and the next
one tried; the answer names exactly what was accepted.

Issue 23's item "per-message-deflate (RFC 7692) optional": there was no
negotiation before."""
from __future__ import annotations

import os
import re

import pytest
from hypothesis import given, settings, strategies as st

from sockherd.worker._http import ws_pmd_negotiate

pytestmark = pytest.mark.timeout(30)

PMD = "permessage-deflate"


@pytest.mark.parametrize("offer, answer", [
    ("permessage-deflate", PMD),
    ("PerMessage-Deflate", PMD),
    ("permessage-deflate; client_max_window_bits", PMD),
    ("permessage-deflate; client_max_window_bits=10", PMD),
    ('permessage-deflate; client_max_window_bits="15"', PMD),
    ("permessage-deflate; server_no_context_takeover", PMD + "; server_no_context_takeover"),
    ("permessage-deflate; client_no_context_takeover", PMD + "; client_no_context_takeover"),
    ("permessage-deflate;server_no_context_takeover;client_no_context_takeover",
     PMD + "; server_no_context_takeover; client_no_context_takeover"),
    ("permessage-deflate; server_max_window_bits=9", PMD + "; server_max_window_bits=9"),
    ("permessage-deflate; server_max_window_bits=15", PMD + "; server_max_window_bits=15"),
    ('permessage-deflate; server_max_window_bits="12"', PMD + "; server_max_window_bits=12"),
    ("permessage-deflate ; server_max_window_bits = 11 ; client_max_window_bits",
     PMD + "; server_max_window_bits=11"),
])
def test_one_valid_offer_is_answered(offer, answer):
    assert ws_pmd_negotiate([offer]) == answer


@pytest.mark.parametrize("offer", [
    "permessage-deflate; unknown_parameter",                     # unknown
    "permessage-deflate; server_no_context_takeover; server_no_context_takeover",  # twice
    "permessage-deflate; client_max_window_bits; client_max_window_bits=9",
    "permessage-deflate; server_no_context_takeover=1",          # takes no value
    "permessage-deflate; client_no_context_takeover=yes",
    "permessage-deflate; server_max_window_bits",                # needs a value
    "permessage-deflate; server_max_window_bits=7",              # 8..15
    "permessage-deflate; server_max_window_bits=16",
    "permessage-deflate; server_max_window_bits=010",            # no leading zero
    "permessage-deflate; server_max_window_bits=8",              # zlib cannot (raw, 256 B)
    "permessage-deflate; client_max_window_bits=7",
    "permessage-deflate; client_max_window_bits=abc",
    'permessage-deflate; client_max_window_bits="10',            # unterminated quote
    "permessage-deflate;",                                       # a parameter without a name
    "permessage-deflate; =10",
    "permessage-deflate x",                                      # not a parameter list
    "x-webkit-deflate-frame",                                    # another extension
    "",
])
def test_an_invalid_offer_is_declined(offer):
    assert ws_pmd_negotiate([offer]) is None


def test_the_first_acceptable_offer_wins():
    """7.1: several offers in order of preference; the declined ones are
    skipped, the first we can honour answered, the later ones ignored."""
    assert ws_pmd_negotiate([
        "permessage-deflate; server_max_window_bits=8, "
        "permessage-deflate; bogus, "
        "permessage-deflate; client_no_context_takeover, "
        "permessage-deflate; server_no_context_takeover"]) == PMD + "; client_no_context_takeover"


def test_offers_across_header_fields_and_other_extensions():
    assert ws_pmd_negotiate(["x-custom; a=1", "foo, permessage-deflate; server_max_window_bits=10"]) \
        == PMD + "; server_max_window_bits=10"
    assert ws_pmd_negotiate(["permessage-deflate; junk", "permessage-deflate"]) == PMD
    assert ws_pmd_negotiate(["x-custom", "y"]) is None


def test_a_syntax_error_declines_its_offer_only():
    """A quoted comma does not end an offer; after a malformed offer the
    next one is still read."""
    assert ws_pmd_negotiate(['permessage-deflate; x="a, b", permessage-deflate']) == PMD
    assert ws_pmd_negotiate(["permessage-deflate; ;;, permessage-deflate; "
                             "client_no_context_takeover"]) == PMD + "; client_no_context_takeover"


PIECES = st.sampled_from(["permessage-deflate", "server_no_context_takeover",
                          "client_no_context_takeover", "server_max_window_bits",
                          "client_max_window_bits", "x", ";", ",", "=", '"', "\\", " ", "\t",
                          "8", "9", "10", "15", "16", "010", '"12"'])


@settings(max_examples=int(os.environ.get("FUZZ_WS_EXAMPLES", "300")), deadline=None)
@given(st.lists(st.lists(PIECES, max_size=20).map("".join), max_size=3))
def test_any_header_gives_a_well_formed_answer_or_none(values):
    """The parser over arbitrary token soup (also under ASAN: test_ws_asan.py):
    it ends, and what it accepts it answers with known parameters only."""
    answer = ws_pmd_negotiate(values)
    if answer is not None:
        name, *params = answer.split("; ")
        assert name == PMD and len(set(params)) == len(params)
        for p in params:
            assert p in ("server_no_context_takeover", "client_no_context_takeover") or \
                re.fullmatch(r"server_max_window_bits=(9|1[0-5])", p), answer
