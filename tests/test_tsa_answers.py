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
