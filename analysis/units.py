"""Quantities as people write them on a command line or in a file: bandwidths ('10Gbit',
'1.25GB/s'), latencies ('5us'), compute rates ('11.8 TFLOP/s'), per-byte costs ('0.2ns/B'),
comma lists of counts; and back to text.  Shared by the what-if CLI and its cluster files,
the calibration's relinking, the campaign's link shaping and the figures."""

from __future__ import annotations

import re

from core.cli import comma_list


class UnitError(ValueError):
    """A quantity that cannot be read; the message is one line and says what was expected."""


_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 2.0 ** 10, "KI": 2.0 ** 10, "ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40}
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_BANDWIDTH = re.compile(_NUMBER + r"\s*(k|K|M|G|T|Ki|KI|ki|Mi|Gi|Ti)?(bit|bits|b|B|byte|bytes)(/s|ps)?")
_LATENCY = re.compile(_NUMBER + r"\s*(ns|us|µs|μs|ms|s)")
_SIZE = re.compile(r"([0-9]+)\s*(|K|M|G|KB|MB|GB|KiB|MiB|GiB|k|kB)", re.IGNORECASE)
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0}
_FLOPS = re.compile(_NUMBER + r"\s*(k|K|M|G|T|P)?\s*(FLOP/s|FLOPS|flop/s|flops)")
_PER_BYTE = re.compile(_NUMBER + r"\s*(ns|us|µs|μs|ms|s)\s*/\s*(B|byte)")


def parse_bandwidth(text: str) -> float:
    """'10Gbit', '10 Gbit/s', '10Gbps', '1.25GB/s', '400MB', '1Gibit' -> bytes per second.

    A unit is required: b/bit(s) are bits, B/byte(s) bytes; k, M, G, T are powers of 1000,
    Ki, Mi, Gi, Ti of 1024."""
    match = _BANDWIDTH.fullmatch(text.strip())
    if not match:
        raise UnitError(f"cannot read bandwidth {text!r}: give a number and a unit, e.g. 10Gbit or 1.25GB/s")
    value = float(match.group(1)) * _PREFIX[match.group(2) or ""]
    if match.group(3) in ("bit", "bits", "b"):
        value /= 8
    if value <= 0:
        raise UnitError(f"bandwidth must be positive, got {text!r}")
    return value


def parse_flops(text: str) -> float:
    """'11.8 TFLOP/s', '12TFLOPS', '900 GFLOP/s' -> floating-point operations per second
    (k, M, G, T, P are powers of 1000; a unit is required)."""
    match = _FLOPS.fullmatch(str(text).strip())
    if not match:
        raise UnitError(f"cannot read compute rate {text!r}: give a number and a unit, e.g. 11.8 TFLOP/s")
    value = float(match.group(1)) * {**_PREFIX, "P": 1e15}[match.group(2) or ""]
    if value <= 0:
        raise UnitError(f"compute rate must be positive, got {text!r}")
    return value


def parse_per_byte(text: str) -> float:
    """'0.2ns/B', '1 us/byte' -> seconds per byte (0 allowed)."""
    match = _PER_BYTE.fullmatch(str(text).strip())
    if not match:
        raise UnitError(f"cannot read per-byte cost {text!r}: give a time per byte, e.g. 0.2ns/B")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def parse_latency(text: str) -> float:
    """'5us', '5 µs', '0.05ms', '100ns', '1e-6s' -> seconds (a unit is required; 0 allowed)."""
    match = _LATENCY.fullmatch(text.strip())
    if not match:
        raise UnitError(f"cannot read latency {text!r}: give a number and a unit, e.g. 5us or 0.2ms")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def items(text: str, what: str) -> list[str]:
    """The distinct items of a comma list, in order (`core.cli.comma_list`: an empty item is
    an error)."""
    return list(dict.fromkeys(comma_list(text, what, UnitError)))


def parse_counts(text: str, what: str) -> list[int]:
    values = []
    for item in items(text, what):
        if not re.fullmatch(r"[0-9]+", item) or int(item) < 1:
            raise UnitError(f"{what} must be whole numbers >= 1, got {item!r}")
        values.append(int(item))
    return sorted(set(values))


def format_bandwidth(bytes_per_s: float) -> str:
    bits = round(bytes_per_s * 8, 3)  # 1 / (1 / x) is not always x
    for unit, size in (("Tbit", 1e12), ("Gbit", 1e9), ("Mbit", 1e6), ("kbit", 1e3)):
        if bits >= size:
            return f"{bits / size:g}{unit}"
    return f"{bits:g}bit"


def format_flops(per_second: float) -> str:
    for unit, size in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if per_second >= size:
            return f"{per_second / size:.4g} {unit}"
    return f"{per_second:.4g} FLOP/s"


def format_latency(seconds: float) -> str:
    for unit, size in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= size * (1 - 1e-9):
            return f"{round(seconds / size, 9):g}{unit}"
    return f"{seconds / 1e-9:g}ns"


def parse_size(text: str) -> int:
    """'1K', '64M', '4096', '1MiB' -> bytes (K, M, G are powers of 1024, as in nccl-tests)."""
    match = _SIZE.fullmatch(str(text).strip())
    if not match:
        raise UnitError(f"cannot read size {text!r}: give bytes with an optional K, M or G, e.g. 1K or 64M")
    unit = match.group(2).upper().replace("IB", "").replace("B", "")
    return int(match.group(1)) * {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}[unit]
