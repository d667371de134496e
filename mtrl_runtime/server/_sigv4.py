"""SigV4 presigned-token verification for SageMaker-compat bearer tokens (pure hashlib/hmac, no AWS SDK).

SageMaker's ``generate_token`` presigns ``POST https://sagemaker.amazonaws.com/?Action=CallWithBearerToken``
with the agent's AWS credentials (botocore ``SigV4QueryAuth``, signed header ``host``), appends
``&Version=1`` and base64-encodes the URL. Whoever holds the secret access key can make one; so the
coordinator recomputes the signature with the secret the run is configured with and compares it in
constant time. A token with a made-up key or signature is refused.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qsl, quote

_UNSIGNED = ("X-Amz-Signature", "Version")  # the signature itself, and what generate_token appends after signing


def presign_signature(host_path_query: str, secret: str) -> str:
    """The SigV4 signature of a presigned URL (``host/path?query``, no scheme) under ``secret``."""
    host, _, rest = host_path_query.partition("/")
    path, _, query = rest.partition("?")
    params = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in _UNSIGNED]
    canonical_query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params)
    )
    values = dict(params)
    signed_headers = values.get("X-Amz-SignedHeaders", "host")
    canonical_request = "\n".join([
        "POST", "/" + path, canonical_query, f"host:{host}", "", signed_headers,
        hashlib.sha256(b"").hexdigest(),
    ])
    amz_date = values.get("X-Amz-Date", "")
    _, date, region, service, terminal = (values.get("X-Amz-Credential", "").split("/") + [""] * 5)[:5]
    scope = f"{date}/{region}/{service}/{terminal}"
    to_sign = "\n".join([
        "AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical_request.encode()).hexdigest(),
    ])
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, terminal):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def signature_problem(host_path_query: str, access_key_id: str, secret: str) -> str | None:
    """Why the presigned URL was not signed by ``access_key_id`` / ``secret`` (None when it was)."""
    values = dict(parse_qsl(host_path_query.partition("?")[2], keep_blank_values=True))
    key_id = values.get("X-Amz-Credential", "").split("/")[0]
    if not hmac.compare_digest(key_id.encode(), access_key_id.encode()):
        return "it is signed by an access key this run is not configured with"
    expected = presign_signature(host_path_query, secret)
    if not hmac.compare_digest(expected.encode(), values.get("X-Amz-Signature", "").encode()):
        return "its signature does not match the run's SageMaker credentials"
    return None


__all__ = ["presign_signature", "signature_problem"]
