"""`python -m models list` and `python -m models summary NAME [--json]`.

The summary is the per-layer table the report and the communication model rely on (shapes,
parameters, forward FLOPs, gradient bytes), printed so a user can check a model by eye.
"""

from __future__ import annotations

import json
import sys

from core.cli import OneLineParser, fail

from .spec import ModelSpec
from .zoo import MODEL_NAMES, UnknownModel, get_model


def _shape(shape) -> str:
    return "x".join(str(d) for d in shape)


def summary_json(spec: ModelSpec) -> dict:
    """The machine-readable summary (`--json`)."""
    return {
        "model": spec.name,
        "reference": spec.reference,
        "input_shape": list(spec.input_shape),
        "num_classes": spec.num_classes,
        "params": spec.total_params,
        "flops": spec.total_flops,
        "grad_bytes": sum(row.grad_bytes for row in spec.layer_table()),
        "layers": [row.as_dict() for row in spec.layer_table()],
    }


def summary_text(spec: ModelSpec) -> str:
    """A fixed-width table, one row per layer, then the totals."""
    rows = [("layer", "kind", "output", "params", "fwd FLOPs", "grad bytes")]
    for r in spec.layer_table():
        rows.append((r.name, r.kind, _shape(r.output_shape), f"{r.params:,}", f"{r.flops:,}",
                     f"{r.grad_bytes:,}"))
    rows.append(("total", "", "", f"{spec.total_params:,}", f"{spec.total_flops:,}",
                 f"{4 * spec.total_params:,}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"{spec.name}: input {_shape(spec.input_shape)}, {spec.num_classes} classes "
             f"({spec.reference})"]
    for i, row in enumerate(rows):
        if i == len(rows) - 1:
            lines.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
        cells = [c.ljust(w) if j < 3 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m models",
                                     description="Describe the study's reference networks.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the model names")
    summary = sub.add_parser("summary", help="per-layer shapes, parameters, FLOPs, gradients")
    summary.add_argument("name", help=f"one of: {', '.join(MODEL_NAMES)}")
    summary.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)

    if args.command == "list":
        print("\n".join(MODEL_NAMES))
        return 0
    try:
        spec = get_model(args.name)
    except UnknownModel as exc:
        return fail(exc)
    print(json.dumps(summary_json(spec), indent=1) if args.json else summary_text(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
