"""The engine registry: entries that contradict themselves are refused, an engine registered from outside the
package (docs/register_engine.md) is taken by the config checks and the --model specs, scripts name their bad
line, and no module outside the registry branches on an engine's name."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
import torch

from sao.agent.engines import registry
from sao.agent.engines.protocols import SamplingParams
from sao.agent.engines.registry import InProcessArgs, ModelSpecError, engine_spec, register_engine
from sao.agent.engines.scripted import load_script
from sao.core.tiny_models import build_tiny_model
from sao.trainer.config import ConfigError, load_config
from tests._engine_doc import register_doc_engine

ROOT = Path(__file__).resolve().parents[3]
TOY = ROOT / "configs" / "toy.yaml"


def _noop(a: InProcessArgs) -> object:
    return object()


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"in_process": _noop}, "needs weight_sync kinds"),
        ({"in_process": _noop, "weight_sync": ("rsync",)}, "weight_sync kinds ['rsync'] unknown"),
        ({"weight_sync": ("checkpoint",)}, "nothing would receive weights"),
        ({"in_process": _noop, "connect": lambda u, s: None, "weight_sync": ("checkpoint",)}, "not both"),
        ({"connect": lambda u, s: None, "weight_sync": ("checkpoint",), "ray_actor": True}, "ray_actor needs serve"),
        ({"restricted_vocab": True}, "restricted_vocab needs in_process"),
    ],
)
def test_contradicting_entries_are_refused(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        register_engine("contradiction", "a bad entry", **fields)
    assert "contradiction" not in [e.name for e in registry.engines()]


def test_taken_names_and_spec_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="'vllm' is already registered"):
        register_engine("vllm", "a second vllm")
    form = registry.SpecForm("local", "local:DIR", lambda t, x: registry.ModelSpec("local"), None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind 'local' belongs to 'vllm'"):
        register_engine("another_local", "steals local:", specs=(form,))


def test_the_shipped_entries_carry_what_the_trainer_branches_on() -> None:
    hf, vllm = engine_spec("hf"), engine_spec("vllm")
    assert (hf.placement, hf.weight_sync, hf.restricted_vocab, hf.ray_actor) == (
        "in_process",
        ("checkpoint",),
        True,
        False,
    )
    assert (vllm.placement, vllm.weight_sync, vllm.ray_actor) == ("server", ("checkpoint", "broadcast"), True)
    # the doc's torch_sampler may be registered already by an earlier test in this process (it registers once)
    assert [n for n in registry.trainable_engines() if n != "torch_sampler"] == ["hf", "vllm"]
    assert engine_spec("openai").placement is None and engine_spec("solver").demonstrator is not None
    with pytest.raises(ValueError, match="unknown engine 'sglang'; registered: hf, vllm"):
        engine_spec("sglang")


def test_a_non_training_engine_is_refused_as_rollout_engine() -> None:
    with pytest.raises(ConfigError, match=r"rollout.engine: 'openai' cannot train"):
        load_config(TOY, ["rollout.engine=openai", "rollout.action_vocab=[]"])
    with pytest.raises(ConfigError, match=r"rollout.engine: unknown 'sglang'; use one of hf, vllm"):
        load_config(TOY, ["rollout.engine=sglang"])


def test_the_stages_engine_must_hold_or_serve_the_model() -> None:
    quickstart = ROOT / "configs" / "quickstart.yaml"
    # a server engine serves each stage's model directory itself
    assert load_config(quickstart, ["rollout.stage_engine=vllm"]).rollout.stage_engine == "vllm"
    assert load_config(quickstart, ["rollout.engine=vllm"]).rollout.stage_engine is None
    with pytest.raises(ConfigError, match=r"stages: eval, pretrain_value play the current model, which "
                       r"rollout.stage_engine='openai' can neither hold in this process nor serve"):  # fmt: skip
        load_config(quickstart, ["rollout.stage_engine=openai"])
    with pytest.raises(ConfigError, match=r"rollout.stage_engine: unknown 'sglang'"):
        load_config(quickstart, ["rollout.stage_engine=sglang"])
    with pytest.raises(ConfigError, match=r"model.path='tiny:llama' is built in memory"):
        load_config(quickstart, ["rollout.stage_engine=vllm", "model.path=tiny:llama"])


def test_an_engine_registered_outside_the_package_is_configured_from_its_entry() -> None:
    register_doc_engine()
    cfg = load_config(TOY, ["rollout.engine=torch_sampler"])  # toy restricts the vocabulary: the entry can
    assert cfg.rollout.engine == "torch_sampler"
    with pytest.raises(ConfigError, match=r"weight_sync=broadcast needs rollout.engine=vllm .engine 'torch_sampler'"):
        load_config(TOY, ["rollout.engine=torch_sampler", "rollout.weight_sync=broadcast"])
    with pytest.raises(ConfigError, match=r"cluster.backend=ray needs a server engine, rollout.engine=vllm"):
        load_config(TOY, ["rollout.engine=torch_sampler", "cluster.backend=ray"])
    assert "torch:/path/to/checkpoint" in registry.spec_help()


def test_the_doc_engine_samples_the_logprobs_a_recompute_gives(tmp_path: Path) -> None:
    ns = register_doc_engine()
    model = build_tiny_model("llama", vocab_size=64, seed=0)
    model.save_pretrained(tmp_path, safe_serialization=True)
    spec = registry.parse_model_spec(f"torch:{tmp_path}")
    assert (spec.kind, spec.path) == ("torch", str(tmp_path))
    with pytest.raises(ModelSpecError, match=r"no config.json"):
        registry.parse_model_spec(f"torch:{tmp_path / 'nothing'}")
    built = engine_spec("torch_sampler").in_process(InProcessArgs(model, None, version=3))  # type: ignore[misc]
    assert isinstance(built, ns["TorchSampler"]) and built.version == 3
    prompt = [1, 5, 9]
    gen = asyncio.run(built.generate(prompt, SamplingParams(max_tokens=4, temperature=0.7, seed=0)))
    with torch.no_grad():
        logits = model(torch.tensor([prompt + list(gen.token_ids)])).logits[0, len(prompt) - 1 : -1].float()
    want = torch.log_softmax(logits / 0.7, -1)[torch.arange(4), torch.tensor(gen.token_ids)]
    assert torch.allclose(torch.tensor(gen.logprobs), want, atol=1e-5)


def test_script_errors_name_the_line(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    p.write_text('{"id": "a", "actions": ["x", "y"]}\n\n{"id": "b", "actions": "not a list"}\n')
    with pytest.raises(ModelSpecError, match=r"s\.jsonl:3"):
        load_script(p)
    p.write_text('{"instance_id": "a", "actions": ["x", "y"]}\n')
    assert load_script(p) == {"a": ["x", "y"]}


# ---- engine names are branched on in the registry only ------------------------------------------------------------
# ("local" is left out: it is also cluster.backend's value.)
ENGINE_WORDS = {"hf", "vllm", "solver", "swe_demonstrator", "openai", "scripted"}
PARTS = [f"sao/{part}" for part in ("core", "sandboxes", "envs", "agent", "eval", "trainer", "benchmarks", "cli")]
REGISTRY_FILES = {"sao/agent/engines/registry.py", "sao/agent/engines/builtin.py"}
# Files that name engines for another reason than choosing one:
NOT_A_CHOICE = {
    "sao/benchmarks/bench_engine.py",  # `sao bench engine` measures the hf and vllm engines side by side, by name
    "sao/cli/bench.py",  # its --engines option (hf and/or vllm) for that benchmark
    "sao/benchmarks/throughput_probe.py",  # labels the CPU time of vLLM server processes by their command line
}


def name_branches(source: str, where: str) -> list[str]:
    """``x == "vllm"``, ``x in ("hf", "vllm")``, ``match`` cases on an engine word: each as ``where:line``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            consts = [c for p in parts for c in ([p] if isinstance(p, ast.Constant) else getattr(p, "elts", []))]
        elif isinstance(node, ast.MatchValue):
            consts = [node.value]
        else:
            continue
        hit = [c.value for c in consts if isinstance(c, ast.Constant) and c.value in ENGINE_WORDS]
        if hit:
            out.append(f"{where}:{node.lineno} {hit}")
    return out


def test_the_checker_sees_a_branch_on_an_engine_name() -> None:
    src = 'if r.engine == "hf": pass\nif kind in ("vllm", "x"): pass\nmatch k:\n    case "solver": pass\n'
    assert [b.split()[0] for b in name_branches(src, "m.py")] == ["m.py:1", "m.py:2", "m.py:4"]


def test_engine_names_are_branched_on_only_in_the_registry() -> None:
    found = []
    for pkg in PARTS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in REGISTRY_FILES | NOT_A_CHOICE:
                found += name_branches(path.read_text(encoding="utf-8"), rel)
    assert not found, "branch on the engine's registry entry, not its name:\n" + "\n".join(found)
