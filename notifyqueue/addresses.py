"""The counting form of a recipient: one string per person-reachable address, so that spellings
a provider delivers to the same place count as one recipient.

A notification stores and sends its recipient as the client gave it; this form is only ever
compared and counted (the rate limit's window keys, and any later list keyed by address).

- email: Unicode NFKC, case-folded (local part and domain alike), the domain in IDNA's ASCII
  form. `Ada@Example.COM`, the same in full-width letters, and `ada@bücher.example` /
  `ada@xn--bcher-kva.example` each count as one address.
- sms: as given (an E.164 number is already one spelling per number).
- push: as given (a device token is an opaque, case-sensitive string).
- in_app: as given (a client's own user id).

The domain is encoded with the `idna` package's IDNA 2008 with the UTS 46 mapping, which is what
registries and mail systems follow; the standard library's `idna` codec is IDNA 2003, which maps
`ß` to `ss` and so merges `straße.de` with `strasse.de`, two different domains, and refuses
labels made of characters newer than Unicode 3.2.
"""

from __future__ import annotations

import functools
import unicodedata

import idna


def recipient_key(channel: str, recipient: str) -> str:
    """The recipient's counting form on `channel` (see the module docstring). Never raises: an
    address the IDNA rules refuse keeps its case-folded domain, which is still one spelling."""
    if channel != "email":
        return recipient
    local, at, domain = unicodedata.normalize("NFKC", recipient).rpartition("@")
    if not at:
        return _folded(domain)
    return f"{_folded(local)}@{_domain_ascii(domain.rstrip('.'))}"


def _folded(text: str) -> str:
    # Folding can leave a string that is no longer in NFKC (Unicode's NFKC_Casefold is the same
    # closure), so NFKC again.
    return unicodedata.normalize("NFKC", text.casefold())


@functools.lru_cache(maxsize=4096)
def _domain_ascii(domain: str) -> str:
    # Cached: a claim's recipients share a few domains, and the full UTS 46 mapping of one
    # costs about 15 µs.
    if domain.isascii():
        # UTS 46 maps an ASCII label to its lower case and nothing else; most domains take only
        # this path, twenty times cheaper than the full mapping.
        return domain.lower()
    try:
        # UTS 46 (non-transitional) maps case and compatibility forms itself, and keeps `ß`:
        # folding first would turn it into `ss`, another domain.
        return idna.encode(domain, uts46=True).decode("ascii")
    except idna.IDNAError:
        return _folded(domain)
