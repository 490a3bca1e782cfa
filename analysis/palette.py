"""One fixed colour per aggregation scheme, the same in every figure of every campaign.

The colours are the scheme catalogue's (`core.schemes`), keyed by the scheme's catalogue name
(``torch:ddp``, ``tf:collective``, ``wfbp``), never by a campaign's sorted list of series, so
PyTorch DDP is the same blue in a report of two schemes and in one of nine.  A name the
catalogue does not know gets a colour derived from a hash of the name: stable across processes
and campaigns, though not guaranteed distinct from the catalogue's.
"""

from __future__ import annotations

import colorsys
import hashlib

from core import schemes as catalogue

SCHEME_COLOURS: dict[str, str] = {name: info.colour for name, info in catalogue.SCHEMES.items()}


def fallback_colour(name: str) -> str:
    """A colour for a name the catalogue lacks: hue from the name's SHA-256, medium lightness."""
    digest = hashlib.sha256(name.encode()).digest()
    hue = digest[0] / 256
    lightness = 0.38 + 0.2 * digest[1] / 256
    red, green, blue = colorsys.hls_to_rgb(hue, lightness, 0.65)
    return "#{:02X}{:02X}{:02X}".format(*(round(255 * c) for c in (red, green, blue)))


def scheme_colour(framework, mode=None) -> str:
    """The fixed colour of a run's scheme (its framework and mode), as '#RRGGBB'."""
    key = catalogue.scheme_key(framework, mode)
    return SCHEME_COLOURS.get(key) or fallback_colour(key)


def colour(name: str) -> str:
    """The colour of a scheme named as a user types it: ``FRAMEWORK:MODE``, a framework alone
    (its first mode), or a textbook scheme."""
    try:
        return catalogue.resolve(name).colour
    except catalogue.UnknownScheme:
        return fallback_colour(str(name).strip().lower())
