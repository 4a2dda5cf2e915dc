"""keel.signed_urls: the download links' HMAC, expiry and key separation."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from keel import signed_urls
from keel.webhooks import sign as sign_webhook

KEY = signed_urls.derive_key("s3cret")
PATH = "/design/artifacts/blake3:" + "ab" * 32


def test_a_signed_path_verifies_until_it_expires() -> None:
    url = signed_urls.signed_path(KEY, PATH, 1_000)
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert parts.path == PATH and query["expires"] == "1000"
    assert signed_urls.verify(KEY, PATH, 1_000, query["sig"], now=999.9)
    assert not signed_urls.verify(KEY, PATH, 1_000, query["sig"], now=1_000)
    assert not signed_urls.verify(KEY, PATH, 1_000, query["sig"], now=5_000)


def test_any_change_breaks_the_signature() -> None:
    sig = signed_urls.signature(KEY, PATH, 1_000)
    assert not signed_urls.verify(KEY, PATH, 2_000, sig, now=0)  # a later expiry
    assert not signed_urls.verify(KEY, PATH.replace("ab", "cd", 1), 1_000, sig, now=0)
    assert not signed_urls.verify(signed_urls.derive_key("other"), PATH, 1_000, sig, now=0)
    flipped = ("0" if sig[0] != "0" else "1") + sig[1:]
    assert not signed_urls.verify(KEY, PATH, 1_000, flipped, now=0)
    assert not signed_urls.verify(KEY, PATH, 1_000, "", now=0)
    # Whatever a query string holds is an answer, not an error.
    assert not signed_urls.verify(KEY, PATH, 1_000, "é" * 64, now=0)


def test_the_key_is_bound_to_its_purpose() -> None:
    assert signed_urls.derive_key("s3cret") != signed_urls.derive_key("s3cret", b"other")
    # A webhook signature made with the raw secret over the same text is not a link's.
    webhook = sign_webhook("s3cret", 1_000, PATH.encode()).removeprefix("sha256=")
    assert not signed_urls.verify(KEY, PATH, 1_000, webhook, now=0)
    assert signed_urls.signature(KEY, PATH, 1_000) == signed_urls.signature(KEY, PATH, 1_000)
