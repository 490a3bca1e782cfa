"""docs/adding-a-model.md, proved: VGG-16 (configuration D of Simonyan and Zisserman 2015) and
its tiny variant, added as the guide says (a builder and two `MODELS` entries in models/zoo.py)
into a copy of the repository and nothing else changed: its parameter count is the published
138,357,544, PyTorch and TensorFlow build it from the one description and agree on its step,
and a campaign plans it with the model's default batch."""

from __future__ import annotations

import json

import pytest

from tests.conftest import copy_of_the_repository, insert_at_table_end, run_cli

VGG16_BUILDER = '''
# --------------------------------------------------------------------------- VGG-16

VGG16_STAGES = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


def vgg16(tiny: bool = False) -> ModelSpec:
    """VGG-16 (configuration D): 13 3x3 convs in 5 stages, each closed by a 2x2 max pool, and 3
    FCs; 224x224 input.  Tiny: widths / 8, FC 256, 10 classes, input 3x32x32 (pool5 is 1x1)."""
    d = TINY_WIDTH_DIVISOR if tiny else 1
    fc = 256 if tiny else 4096
    classes = TINY_CLASSES if tiny else 1000
    layers = []
    for stage, widths in enumerate(VGG16_STAGES, start=1):
        for index, width in enumerate(widths, start=1):
            layers += [Conv2d(f"conv{stage}_{index}", width // d, 3, pad=1), ReLU(f"relu{stage}_{index}")]
        layers.append(Pool2d(f"pool{stage}", "max", 2, stride=2))
    layers += [Flatten("flatten"), Linear("fc6", fc), ReLU("relu6"), Dropout("drop6", 0.5),
               Linear("fc7", fc), ReLU("relu7"), Dropout("drop7", 0.5), Linear("fc8", classes)]
    return ModelSpec(name="vgg16-tiny" if tiny else "vgg16",
                     input_shape=(3, 32, 32) if tiny else (3, 224, 224), num_classes=classes,
                     root=Sequential("vgg16", tuple(layers)),
                     reference="Simonyan and Zisserman 2015, configuration D")

'''
MODEL_ENTRIES = '''    "vgg16": ModelFacts(lambda: vgg16(), {"gpu": 64, "cpu": 4}, 5e-2),
    "vgg16-tiny": ModelFacts(lambda: vgg16(tiny=True), TINY_BATCH, 1e-4),
'''


def add_vgg16(zoo) -> None:
    """The builder before the catalogue section, the entries at the end of `MODELS`."""
    text = zoo.read_text()
    catalogue = text.index("@dataclass(frozen=True)\nclass ModelFacts")
    zoo.write_text(text[:catalogue] + VGG16_BUILDER.lstrip("\n") + "\n" + text[catalogue:])
    insert_at_table_end(zoo, MODEL_ENTRIES, "MODELS: dict[str, ModelFacts]", "}")


@pytest.mark.slow
def test_a_model_is_one_entry(tmp_path, torch_python, tf_python):
    repo = copy_of_the_repository(tmp_path / "repo")
    add_vgg16(repo / "models" / "zoo.py")

    summary = run_cli("models", "summary", "vgg16", "--json", cwd=repo, timeout=120)
    assert summary.returncode == 0, summary.stderr[-2000:]
    assert json.loads(summary.stdout)["params"] == 138_357_544

    checked = run_cli("launchers.check", "--frameworks", "torch,tf", "--model", "vgg16-tiny",
                      cwd=repo, timeout=600)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-2000:]
    assert "PASS: vgg16-tiny" in checked.stdout

    planned = run_cli("launchers.compare", "--frameworks", "torch", "--model", "vgg16",
                      "--workers", "2", "--out", str(tmp_path / "c"), "--dry-run", cwd=repo,
                      env={"COLUMNS": "200"}, timeout=120)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "torch-ddp-vgg16-1x2-b4-" in planned.stdout + planned.stderr  # the entry's CPU batch
    assert not (tmp_path / "c").exists()
