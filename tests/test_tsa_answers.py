"""What a timestamp authority answers is checked, and an answer that is none is one line naming the authority."""

from __future__ import annotations

from pathlib import Path

import pytest
from asn1crypto import tsp

from buildtool.common import tsa
from buildtool.common.errors import FailedError
from tests.tsa import LoopbackTsa


@pytest.mark.parametrize("status", [2, 6, 255])
def test_a_status_that_grants_nothing_is_a_refusal_not_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   status: int) -> None:
    """request_timestamp read the answer's status as rfc3161-client's PKIStatus enum, which has no member for a
    status RFC 3161 does not define: an authority that answered 6 ended `build --tsa` in a ValueError traceback
    instead of a refusal naming it. Any status but granted is that refusal now."""
    import requests

    with LoopbackTsa(tmp_path) as authority:
        real_post = requests.post

        def answer_with_status(url: str, data: bytes, **kwargs: object) -> requests.Response:
            response = real_post(url, data=data, **kwargs)
            granted = tsp.TimeStampResp.load(response.content)
            response._content = tsp.TimeStampResp({"status": {"status": status},
                                                   "time_stamp_token": granted["time_stamp_token"]}).dump()
            return response

        monkeypatch.setattr(requests, "post", answer_with_status)
        with pytest.raises(FailedError) as refused:
            tsa.request_timestamp(authority.url, b"signature")
    assert str(refused.value) == f"the timestamp authority {authority.url} refused the request (status {status})"


def test_a_netrc_login_never_goes_to_the_authority_and_a_redirect_is_not_followed(netrc_default_login: str) -> None:
    """requests adds ~/.netrc's login for a host given no auth (its `default` entry for any host), and re-reads it
    after each redirect: the login went to the timestamp authority, and to wherever it redirected (registry hunt)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str | None] = []

    class Redirecting(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            seen.append(self.headers.get("Authorization"))
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/tsr"
        with pytest.raises(FailedError) as refused:
            tsa.request_timestamp(url, b"signature")
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [None]
    assert str(refused.value) == (f"the timestamp authority {url} answered HTTP 307, a redirect, which is not "
                                  "followed: set DL_IMAGES_TSA_URL to the URL it redirects to")
