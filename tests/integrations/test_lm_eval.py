"""The lm-evaluation-harness model ``drmlab`` (drmlab.integrations.lm_eval_adapter, drmlab lm-eval;
docs/integrations.md): rolling log-likelihoods are drmlab eval's rescoring of the same text, recurrent
models carry their state over long texts exactly, generate_until is drmlab generate, and the harness
runs local YAML tasks end to end. Offline: nothing is downloaded (HF_DATASETS_OFFLINE, HF_HUB_OFFLINE)."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

# set before datasets / huggingface_hub read them (at their import)
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("lm_eval")  # the eval extra

from lm_eval.api.instance import Instance  # noqa: E402

from drmlab.cli import main  # noqa: E402
from drmlab.data import get_tokenizer  # noqa: E402
from drmlab.evaluation import rescore  # noqa: E402
from drmlab.generation import generate  # noqa: E402
from drmlab.integrations.lm_eval_adapter import DrmlabLM, context_limit  # noqa: E402
from drmlab.models import build_model  # noqa: E402
from drmlab.runs import RunDir  # noqa: E402

BYTES = get_tokenizer("bytes")
TEXT = "def area(radius):\n    return 3.14159 * radius ** 2\n\nprint(area(2.5))\n"  # 69 bytes > GPT2's 32 positions


def _model(name: str, seed: int = 3) -> torch.nn.Module:
    model = build_model(name, "micro", seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model.eval()


def _request(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


@pytest.mark.parametrize("name", ["J", "GPT2"])
def test_rolling_loglikelihood_is_the_rescoring(name):
    """After a one-token prefix, the rolling log-likelihood is -total_nats of drmlab eval's rescoring of
    prefix + text: one window over the whole text for a model without a position table (its state
    carries), windows of the position table's length (32) for GPT2."""
    model = _model(name)
    lm = DrmlabLM(model=model, tokenizer=BYTES, prefix="\n")
    stream = torch.tensor([10] + list(TEXT.encode()))
    window = context_limit(model) or len(stream) - 1
    assert (context_limit(model) is None) == (name == "J")
    (rolling,) = lm.loglikelihood_rolling([_request("loglikelihood_rolling", TEXT)])
    assert rolling == -rescore(model, stream, window, batch_size=1)["total_nats"]
    if name == "J":  # the carried state is not drmlab eval's windowed context
        assert rolling != -rescore(model, stream, 32, batch_size=1)["total_nats"]


@pytest.mark.parametrize("name", ["J", "MAMBA", "RESOLVENT", "LLAMA"])
def test_long_texts_carry_the_state_exactly(name):
    """A text longer than max_parallel is prefilled, then stepped with the carried state: the same
    log-likelihoods as one parallel pass, and as log-softmax of the full forward (float64)."""
    model = _model(name).double()
    ids = [10, 10] + list(TEXT.encode())
    plain = list(TEXT.encode())
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]])).logits[0], -1)
        logp_plain = torch.log_softmax(model(torch.tensor([plain[:-1]])).logits[0], -1)
    reference = [logp[t, ids[t + 1]].item() for t in range(len(ids) - 1)]
    after_40 = sum(logp_plain[t, plain[t + 1]].item() for t in range(39, len(plain) - 1))
    stepped = DrmlabLM(model=model, tokenizer=BYTES, max_parallel=9)
    parallel = DrmlabLM(model=model, tokenizer=BYTES)
    for lm in (stepped, parallel):
        (rolling,) = lm.loglikelihood_rolling([_request("loglikelihood_rolling", TEXT)])
        assert rolling == pytest.approx(sum(reference[1:]), rel=1e-12)
        context, continuation = TEXT[:40], TEXT[40:]
        ((logprob, _),) = lm.loglikelihood([_request("loglikelihood", context, continuation)])
        assert logprob == pytest.approx(after_40, rel=1e-12)


def test_loglikelihood_greedy_flag_and_gpt2_context_window():
    model = _model("J")
    lm = DrmlabLM(model=model, tokenizer=BYTES)
    greedy = generate(model, BYTES, "def f(x):", max_new_tokens=6, temperature=0).text
    assert greedy and lm.loglikelihood([_request("loglikelihood", "def f(x):", greedy)])[0][1] is True
    other = chr(greedy.encode()[0] ^ 1) + greedy[1:]
    assert lm.loglikelihood([_request("loglikelihood", "def f(x):", other)])[0][1] is False
    # GPT2 has 32 positions: the continuation is scored after the last 32 - len(continuation) context tokens
    gpt2 = _model("GPT2").double()
    ids = list(TEXT.encode())
    lm = DrmlabLM(model=gpt2, tokenizer=BYTES)
    ((logprob, _),) = lm.loglikelihood([_request("loglikelihood", TEXT[:-5], TEXT[-5:])])
    with torch.no_grad():
        logp = torch.log_softmax(gpt2(torch.tensor([ids[-33:-1]])).logits[0], -1)
    assert logprob == pytest.approx(sum(logp[t, ids[-32 + t]].item() for t in range(27, 32)), rel=1e-12)


@pytest.mark.parametrize("name", ["J", "GPT2", "LLAMA"])
def test_generate_until_is_drmlab_generate(name):
    model = _model(name)
    lm = DrmlabLM(model=model, tokenizer=BYTES)
    want = generate(model, BYTES, "x = 1\ny =", max_new_tokens=10, temperature=0).text
    assert lm.continue_text("x = 1\ny =", {"until": [], "max_gen_toks": 10}) == want
    stop = want[3:5]
    (cut,) = lm.generate_until([_request("generate_until", "x = 1\ny =", {"until": [stop], "max_gen_toks": 10})])
    assert cut == want[: want.index(stop)]


# ---------------------------------------------------------------- the harness end to end


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """A folder of harness YAML tasks over a JSONL file: one per request type, and one whose data
    is on the Hugging Face Hub."""
    root = tmp_path_factory.mktemp("tasks")
    docs = [
        {
            "question": f"v{i} = {i}\nprint(v{i}",
            "choices": [")", "]", "x"],
            "answer": 0,
            "text": f"def g{i}(a, b):\n    return a + b * {i}\n",
            "prompt": f"x = {i}\ny =",
            "target": " 1",
        }
        for i in range(3)
    ]
    (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    data = (
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'docs.jsonl'}\n"
        f"  cache_dir: {root / 'cache'}\ntest_split: test\n"
    )
    (root / "choice.yaml").write_text(
        "task: drmlab_choice\n" + data + "output_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n"
    )
    (root / "rolling.yaml").write_text(
        "task: drmlab_rolling\n" + data + "output_type: loglikelihood_rolling\ndoc_to_text: ''\n"
        "doc_to_target: '{{text}}'\nmetric_list:\n  - metric: bits_per_byte\n"
    )
    (root / "gen.yaml").write_text(
        "task: drmlab_gen\n" + data + "output_type: generate_until\ndoc_to_text: '{{prompt}}'\n"
        "doc_to_target: '{{target}}'\ngeneration_kwargs:\n  until: ['\\n']\n  max_gen_toks: 6\n"
        "metric_list:\n  - metric: exact_match\n"
    )
    (root / "remote.yaml").write_text(
        "task: drmlab_remote\ndataset_path: EleutherAI/lambada_openai\ndataset_name: default\ntest_split: test\n"
        "output_type: loglikelihood\ndoc_to_text: '{{text}}'\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: acc\n"
    )
    return root, docs


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A J micro run directory (config.json and a committed checkpoint of perturbed weights)."""
    path = tmp_path_factory.mktemp("run")
    run = RunDir(path)
    run.write_config(
        {
            "model": "J",
            "preset": "micro",
            "overrides": {},
            "vocab_size": 256,
            "tokenizer": "bytes",
            "train": {"seed": 3, "seq_len": 32},
        }
    )
    run.save_checkpoint(_model("J"), None, {"step": 1, "tokens": 256})
    return path


def test_drmlab_lm_eval_runs_local_tasks(tasks, run_dir, tmp_path, capsys):
    root, docs = tasks
    output = tmp_path / "results.json"
    code = main(
        [
            "lm-eval",
            "--ckpt",
            str(run_dir),
            "--tasks",
            "drmlab_choice,drmlab_rolling,drmlab_gen",
            "--include-path",
            str(root),
            "--prefix",
            "\n",
            "--output",
            str(output),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "drmlab_rolling" in captured.out and "bits_per_byte" in captured.out
    results = json.loads(output.read_text())["results"]
    assert 0 <= results["drmlab_choice"]["acc,none"] <= 1 and "exact_match,none" in results["drmlab_gen"]
    model, _, _ = RunDir(run_dir).load_model("cpu")
    nats = sum(
        rescore(model, torch.tensor([10] + list(d["text"].encode())), len(d["text"]), batch_size=1)["total_nats"]
        for d in docs
    )
    n_bytes = sum(len(d["text"].encode()) for d in docs)
    assert results["drmlab_rolling"]["bits_per_byte,none"] == pytest.approx(nats / (math.log(2) * n_bytes), rel=1e-12)


def test_an_export_is_evaluated_like_its_run(tasks, run_dir, tmp_path, capsys):
    pytest.importorskip("transformers")
    from drmlab.integrations.lm_eval_adapter import evaluate

    root, _ = tasks
    export = tmp_path / "hf"
    assert main(["export", "--ckpt", str(run_dir), "--out", str(export)]) == 0
    capsys.readouterr()
    numbers = [
        evaluate(ckpt, ["drmlab_rolling"], include_path=[str(root)])["results"]["drmlab_rolling"]
        for ckpt in (run_dir, export)
    ]
    assert numbers[0]["bits_per_byte,none"] == numbers[1]["bits_per_byte,none"]


def test_refusals_are_one_line(tasks, run_dir, tmp_path, capsys):
    root, _ = tasks
    code = main(["lm-eval", "--ckpt", str(run_dir), "--tasks", "drmlab_remote", "--include-path", str(root)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and _one_error_line(err).endswith("give a local task with --include-path")
    assert "task 'drmlab_remote' needs its data from the network" in err
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["lm-eval", "--ckpt", str(foreign), "--tasks", "drmlab_rolling", "--include-path", str(root)]) == 2
    assert "type 'llama', not a drmlab export" in _one_error_line(capsys.readouterr().err)


def _one_error_line(err: str) -> str:
    """The command's error: exactly one line (progress bars of datasets may come before it)."""
    lines = [line for line in err.strip().splitlines() if line.startswith("drmlab lm-eval: error:")]
    assert len(lines) == 1 and err.strip().endswith(lines[0]), err
    return lines[0]
