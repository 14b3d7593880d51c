"""Tiny transformers models built from configs (no download) for the tests that compare attnviz's capture with the
model's own eager attention."""

from __future__ import annotations

#: the size every family's config starts from (each test adds what its family needs)
SMALL = dict(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def model_pair(config_name: str, extra: dict, cls_name: str = "AutoModelForCausalLM",
               device: str = "cpu") -> tuple[object, object]:
    """The model as transformers builds it (its default implementation) and the same weights eager, on ``device``:
    ``transformers.<config_name>(**SMALL, **extra)`` built by ``transformers.<cls_name>`` from seed 0. torch and
    transformers are imported here, when a test first builds one, not while every worker collects."""
    import copy

    import torch
    import transformers

    cfg = getattr(transformers, config_name)(**{**SMALL, **extra})
    auto = getattr(transformers, cls_name)
    torch.manual_seed(0)
    model = auto.from_config(cfg).eval()
    eager = auto.from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    return model.to(device), eager.to(device)
