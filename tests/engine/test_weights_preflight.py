"""Checkpoint preflight (config.json + safetensors headers, no tensor data): the check the SGLang
engine runs before forwarding an update, since SGLang loads in place."""
from __future__ import annotations

import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from helpers.tiny_models import save_tiny_model
from sparrow_server.engine.checkpoint_preflight import checkpoint_signature, preflight, safetensors_header
from sparrow_server.engine.weights import WeightLoadError


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("preflight")
    dirs = {"a": save_tiny_model(root / "a", seed=0), "b": save_tiny_model(root / "b", seed=1),
            "wider": save_tiny_model(root / "wider", seed=0, intermediate_size=96),
            "qwen3": save_tiny_model(root / "qwen3", "qwen3", seed=0)}
    reshaped = root / "reshaped"  # same config, one tensor of another shape (a corrupt or foreign export)
    reshaped.mkdir()
    shutil.copy(dirs["a"] / "config.json", reshaped / "config.json")
    tensors = load_file(str(dirs["a"] / "model.safetensors"))
    name = sorted(n for n in tensors if n.endswith("q_proj.weight"))[0]
    tensors[name] = torch.zeros(tensors[name].shape[0] + 16, tensors[name].shape[1])
    save_file(tensors, str(reshaped / "model.safetensors"))
    dirs.update(reshaped=reshaped, root=root, reshaped_name=name)
    return dirs


def test_header_matches_the_safetensors_library(ckpt):
    file = ckpt["a"] / "model.safetensors"
    with safe_open(str(file), framework="pt") as f:
        expected = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert {k: shape for k, (_, shape) in safetensors_header(file).items()} == expected
    assert checkpoint_signature(ckpt["a"]).tensors.keys() == expected.keys()


def test_same_architecture_passes(ckpt):
    preflight(ckpt["a"], ckpt["b"])


@pytest.mark.parametrize("name, words", [("wider", "intermediate_size: serving 128, new 96"),
                                         ("qwen3", "model_type: serving 'llama', new 'qwen3'"),
                                         ("reshaped", "shapes differ")])
def test_other_architectures_are_refused_naming_the_difference(ckpt, name, words):
    with pytest.raises(WeightLoadError) as info:
        preflight(ckpt["a"], ckpt[name])
    assert info.value.field == "model_path" and words in str(info.value)
    if name == "reshaped":
        assert ckpt["reshaped_name"] in str(info.value)


def test_missing_and_empty_directories_are_refused(ckpt):
    (ckpt["root"] / "empty").mkdir(exist_ok=True)
    for path, words in [(ckpt["root"] / "missing", "no such directory"), (ckpt["root"] / "empty", "no config.json")]:
        with pytest.raises(WeightLoadError, match=words):
            preflight(ckpt["a"], path)
