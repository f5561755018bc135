"""The native HTTP extension under AddressSanitizer + UBSan: it is compiled
again with the sanitizers (same sources, llhttp's included), and
test_http_parser.py (its strictness cases, the split-anywhere and garbage
hypothesis fuzzing), test_http_parser_and_wsgi_framing.py (the adversarial
review's cases), test_http_smuggling.py and test_http_limits.py (the raw
line scanner's refusals and limits, over real sockets),
test_wsgi.py (the whole engine: loop turns, connections, responses,
over real sockets), test_parked_response_body.py (a body sent from the loop:
its tail, its resumed iterator, its end however it comes),
test_app_containment.py (whatever an app raises or
hands back, start_response's attributes it sets included),
test_engine_fuzz.py (generated and garbage requests
split anywhere, over real sockets) and test_http_framing_fuzz.py /
test_http_framing_known.py (the whole request path framed against a strict
reference, on the Parser and on sockets; FUZZ_HTTP_EXAMPLES, 100 here unless
set, passes through for bench/fuzz_http.sh's longer runs) and
test_body_buffer_engine.py (a body read in the loop before the app runs:
the held request's edges), test_dispatch_spill_queue.py (per-request
dispatch: the spill queue), the responses of issue 18 §4
(test_response_streaming.py, test_response_headers.py,
test_pipelined_output.py, test_http_refusals.py) and the ASGI adapter's
(test_asgi_http.py, test_asgi_app_errors.py, test_asgi_flow_control.py,
test_aio_loop.py, test_aio_tasks.py, and its extensions': test_asgi_pathsend.py,
test_asgi_trailers.py, test_asgi_body_timeout.py, test_asgi_send_app_code.py), the
websocket scope's send with the app's code inside it (the ws part:
test_asgi_ws_accept_headers.py, test_asgi_ws_send_app_code.py; and a
receive or send abandoned by wait_for, test_asgi_ws_cancel.py), the trusted proxy headers' (test_forwarded_headers.py,
test_forwarded_asgi.py: garbage values included) run against that build in child
interpreters with libasan preloaded (conftest.py swaps it in), one per part
of PARTS below. Any sanitizer report fails the run. The build is the one
the conftest's http_asan_env makes once per test run (tests/http_asan.py)."""
from __future__ import annotations

import os

import pytest

import http_asan
from http_asan import run_under_asan  # noqa: F401  (test_proxy_protocol_asan.py's)

# bench/fuzz_http.sh --asan lengthens the run: FUZZ_HTTP_TIMEOUT seconds more
LONGER = int(os.environ.get("FUZZ_HTTP_TIMEOUT", "0"))
pytestmark = [pytest.mark.timeout(600 + LONGER), pytest.mark.long]


def build_asan(tmp_path) -> dict:
    """The extension built again with ASan + UBSan into tmp_path; the
    environment that makes a child interpreter load it (conftest.py). The
    suite's own tests take the conftest's http_asan_env instead, built
    once per run."""
    return http_asan.child_env(http_asan.build(tmp_path / http_asan.SO_NAME))


# The files above, in parts of a similar length that xdist runs side by
# side (one child over all of them was the suite's longest test by far):
# each part is a child interpreter of its own on the same build.
PARTS = {
    "parser": ["test_http_parser.py", "test_http_parser_and_wsgi_framing.py",
               "test_http_smuggling.py", "test_http_limits.py"],
    "fuzz": ["test_engine_fuzz.py", "test_http_framing_fuzz.py", "test_http_framing_known.py",
             "test_http_pipeline_eof.py"],
    "engine": ["test_wsgi.py", "test_app_containment.py", "test_parked_response_body.py",
               "test_body_buffer_engine.py", "test_dispatch_spill_queue.py"],
    "responses": ["test_response_streaming.py", "test_response_headers.py",
                  "test_pipelined_output.py", "test_http_refusals.py",
                  "test_forwarded_headers.py", "test_forwarded_from_the_right.py"],
    "asgi": ["test_asgi_http.py", "test_asgi_app_errors.py", "test_asgi_flow_control.py",
             "test_aio_loop.py", "test_aio_tasks.py", "test_asgi_pathsend.py", "test_asgi_trailers.py",
             "test_asgi_body_timeout.py", "test_forwarded_asgi.py",
             # the app's code inside a send(): the trailers' use after free
             "test_asgi_send_app_code.py",
             # an app fd closed while registered: its number a connection's after
             "test_aio_fd_closed_while_registered.py",
             # a body error while the app waits in receive()
             "test_asgi_body_errors.py"],
    # the websocket scope's send with the app's code inside it (issue 35)
    "ws": ["test_asgi_ws_accept_headers.py", "test_asgi_ws_send_app_code.py",
           "test_asgi_ws_cancel.py"],
}


@pytest.mark.parametrize("part", sorted(PARTS))
def test_parser_suite_under_asan_and_ubsan(http_asan_env, part):
    env = dict(http_asan_env)
    # the framing fuzz's share of this run: tens of seconds unless asked for more
    env["FUZZ_HTTP_EXAMPLES"] = os.environ.get("FUZZ_HTTP_EXAMPLES", "100")
    run_under_asan(env, PARTS[part], timeout=700 + LONGER)
