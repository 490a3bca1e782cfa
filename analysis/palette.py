"""One fixed colour per aggregation scheme, the same in every figure of every campaign.

A scheme is named as on the command line: the registry's framework name, with its mode where
the framework has several (``tf:collective``, ``mxnet:dist_sync``, ``horovod:gloo``); a
framework with one scheme is its bare name (``torch``, ``cntk``, ``cntk-style``,
``caffe-mpi-style``, ``jax``).  Colours are keyed by that name, never by a campaign's sorted
list of series, so PyTorch DDP is the same blue in a report of two schemes and in one of nine.
The first colours are Okabe-Ito's colour-blind-safe set; related schemes get related hues
(TensorFlow's modes greens, MXNet's purples, Horovod's reds).  A name this table does not know
gets a colour derived from a hash of the name: stable across processes and campaigns, though
not guaranteed distinct from the fixed ones.  `colour` takes a name as the what-if writes it
(``torch:ddp``, ``horovod``, a catalogue name): a framework's name alone is its first mode's
colour.
"""

from __future__ import annotations

import colorsys
import hashlib

SCHEME_COLOURS: dict[str, str] = {
    "torch": "#0072B2",                   # blue
    "cntk": "#E69F00",                    # orange
    "cntk-style": "#D55E00",              # vermillion
    "caffe-mpi-style": "#CC79A7",         # reddish purple
    "tf:collective": "#009E73",           # bluish green
    "tf:ps": "#66C2A5",                   # light green
    "tf:ps-async": "#1B5E20",             # dark green
    "tf:mirrored": "#8BC34A",             # lime
    "mxnet:dist_sync": "#6A3D9A",         # purple
    "mxnet:dist_device_sync": "#9E7BC7",  # lavender
    "mxnet:local": "#3F2A5C",             # dark purple
    "mxnet:device": "#B39DDB",            # light purple
    "mxnet:nccl": "#5E35B1",              # violet
    "horovod:gloo": "#B2182B",            # dark red
    "horovod:mpi": "#F4A582",             # salmon
    "horovod:hierarchical": "#67001F",    # darkest red (the what-if's two-level all-reduce)
    "jax": "#56B4E9",                     # sky blue
}

# The what-if's catalogue of textbook schemes (analysis.whatif.CATALOGUE): greys and earths.
CATALOGUE_COLOURS: dict[str, str] = {
    "no-overlap": "#949494",              # grey
    "wfbp": "#C8B400",                    # mustard
    "mgwfbp": "#8C8000",                  # olive
    "buckets": "#1B4F72",                 # navy
    "fusion": "#F0B25E",                  # sand
    "ps": "#5D4037",                      # brown
}

# Frameworks whose only scheme is shown under the bare framework name.
SINGLE_SCHEME: frozenset[str] = frozenset(
    name for name in SCHEME_COLOURS if ":" not in name)


def scheme_name(framework, mode=None) -> str:
    """The CLI name of a scheme: ``framework:mode``, or the framework alone where the table
    keys it so (its one scheme) or no mode is known."""
    framework = "" if framework is None else str(framework)
    if not mode or framework in SINGLE_SCHEME or mode != mode:  # NaN mode
        return framework
    return f"{framework}:{mode}"


def fallback_colour(name: str) -> str:
    """A colour for a name the table lacks: hue from the name's SHA-256, medium lightness."""
    digest = hashlib.sha256(name.encode()).digest()
    hue = digest[0] / 256
    lightness = 0.38 + 0.2 * digest[1] / 256
    red, green, blue = colorsys.hls_to_rgb(hue, lightness, 0.65)
    return "#{:02X}{:02X}{:02X}".format(*(round(255 * c) for c in (red, green, blue)))


def scheme_colour(framework, mode=None) -> str:
    """The fixed colour of a scheme, as '#RRGGBB'."""
    name = scheme_name(framework, mode)
    return SCHEME_COLOURS.get(name) or SCHEME_COLOURS.get(str(framework)) or fallback_colour(name)


def colour(name: str) -> str:
    """The colour of a scheme named on a command line: a catalogue name, ``FRAMEWORK:MODE``,
    or a framework alone (its one scheme, else its first listed mode: ``horovod`` is
    ``horovod:gloo``'s red)."""
    key = str(name).strip().lower()
    if key in CATALOGUE_COLOURS:
        return CATALOGUE_COLOURS[key]
    framework, _, mode = key.partition(":")
    if mode or framework in SINGLE_SCHEME:
        return scheme_colour(framework, mode or None)
    first = next((c for n, c in SCHEME_COLOURS.items() if n.startswith(f"{framework}:")), None)
    return first or fallback_colour(key)
