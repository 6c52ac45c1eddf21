"""Damage campaign: adversarial cases against real ``drmlab`` verbs, counted (docs/runs.md "The damage campaign").

Each case damages a copy of a finished micro run (SSM_CONTROL, 2k tokens, 8 steps) or gives a verb a bad
path, setting or number, runs the verb in a forked child (:class:`kill_campaign.Campaign`, without the
shim) and checks what a user must see: one line without a traceback naming the file or setting, nothing of
the run changed by a refused verb, damage said rather than passed, and advice that works when followed
(the case runs it). The last line is the summary: ``damage campaign: N cases, F failures``; exit 1 on any.

    PYTHONPATH=src python benchmarks/damage_campaign.py          # about a minute on 2 busy cores
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kill_campaign import Campaign, Outcome  # noqa: E402


def files(run: Path) -> dict[str, bytes]:
    """The run's files but the writer's lock (a refused --resume takes it before it reads anything)."""
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}


def flip_sum(manifest: Path, name: str) -> None:
    """One hex digit of ``name``'s sha256 changed: the manifest stays valid JSON."""
    text = manifest.read_text()
    digit = text.index('"sha256": "', text.index(f'"{name}"')) + 11
    manifest.write_text(text[:digit] + ("0" if text[digit] != "0" else "1") + text[digit + 1 :])


def flip_loss(metrics: Path) -> None:
    text = metrics.read_text()
    at = text.index('"loss": ') + 9
    metrics.write_text(text[:at] + ("1" if text[at] != "1" else "2") + text[at + 1 :])


def status(run: Path) -> str:
    found = re.search(r"<p[^>]*>((?:Finished|Stopped|Interrupted)[^<]*)</p>", (run / "report.html").read_text())
    return found.group(1) if found else ""


class Cases:
    def __init__(self, c: Campaign, pristine: Path):
        self.c, self.pristine, self.results = c, pristine, []

    def fresh(self, name: str) -> Path:
        run = self.c.root / "cases" / name / "run"
        shutil.copytree(self.pristine, run)
        return run

    def check(self, name: str, ok: bool, outcome: Outcome | None, why: str = "") -> None:
        line = outcome.err.strip().splitlines()[-1] if outcome is not None and outcome.err.strip() else ""
        self.results.append({"case": name, "ok": bool(ok), "said": line[:220], "why": why})

    def refused(self, name: str, argv_of, words: str, damage=None) -> None:
        """The verb, on a fresh copy (``damage`` applied first), exits 2 with one line holding ``words`` and
        leaves the run's files as they were."""
        run = self.fresh(name)
        if damage is not None:
            damage(run)
        before = files(run)
        outcome = self.c.verb(argv_of(run))
        ok = outcome.one_line_error and words.format(run=run) in outcome.err and files(run) == before
        self.check(name, ok, outcome, "" if ok else f"exit {outcome.rc}: {outcome.err.strip()[-300:]}")


def run_cases(c: Campaign, pristine: Path) -> list[dict]:
    k = Cases(c, pristine)
    data = ["--data", str(c.corpus), "--cache-dir", str(c.cache), "--threads", "1", "--quiet"]
    ev = lambda run, *more: ["eval", "--ckpt", str(run), *data, *more]  # noqa: E731
    gen = lambda run, *more: ["generate", "--ckpt", str(run), "--prompt", "def ", "--max-tokens", "4", *more]  # noqa: E731
    # item 1: outputs on a run's own files
    ckpt = "checkpoints/step-00000008"
    k.refused("report --out RUN/<ckpt>/model.safetensors", lambda r: ["report", str(r), "--out", f"{r}/{ckpt}/model.safetensors"], "of the run in")  # fmt: skip
    k.refused(
        "report --out RUN/config.json", lambda r: ["report", str(r), "--out", f"{r}/config.json"], "of the run in"
    )
    k.refused("eval --output RUN/checkpoint.json", lambda r: ev(r, "--output", f"{r}/checkpoint.json"), "of the run in")
    k.refused("eval --output RUN/metrics.jsonl", lambda r: ev(r, "--output", f"{r}/metrics.jsonl"), "of the run in")
    k.refused("export --out RUN/checkpoints/hf", lambda r: ["export", "--ckpt", str(r), "--out", f"{r}/checkpoints/hf"], "inside checkpoints/")  # fmt: skip
    # item 2: a damaged manifest, refused by every reader as by resume; the advice repairs it
    for verb, argv_of in (
        ("eval", lambda r: ev(r)),
        ("generate", lambda r: gen(r, "--temperature", "0")),
        ("export", lambda r: ["export", "--ckpt", str(r), "--out", f"{r.parent}/hf"]),
        ("train --resume", lambda r: c.train_argv(r, "3k", "--resume")),
    ):
        name = f"manifest.json sum flipped / {verb}"
        k.refused(name, argv_of, "(the manifest is damaged)", lambda r: flip_sum(r / ckpt / "manifest.json", "optimizer.safetensors"))  # fmt: skip
        run = c.root / "cases" / name / "run"
        shutil.copyfile(run / "checkpoint.json", run / ckpt / "manifest.json")  # the advice
        again = c.verb(argv_of(run))
        k.check(f"{name}: the advice (copy the pointer over it)", again.rc == 0, again, again.err.strip()[-200:])
    # item 2: metrics.jsonl damaged before the checkpoint
    for damage, do in (
        ("a flipped digit", flip_loss),
        ("truncated", lambda m: m.write_text("".join(m.read_text().splitlines(True)[:4]))),
        ("deleted", lambda m: m.unlink()),
    ):
        run = k.fresh(f"metrics {damage} / report")
        do(run / "metrics.jsonl")
        outcome = c.verb(["report", str(run)])
        said = status(run) if outcome.rc == 0 else ""
        ok = "Metrics incomplete or damaged" in said and "verified" not in said
        k.check(f"metrics.jsonl {damage} / report", ok, outcome, said[:200])
    run = k.fresh("metrics a flipped digit / resume")
    flip_loss(run / "metrics.jsonl")
    outcome = c.verb(c.train_argv(run, "3k", "--resume"))
    notes = [line for line in outcome.err.splitlines() if "metrics.jsonl" in line]
    k.check("metrics.jsonl a flipped digit / train --resume", outcome.rc == 0 and len(notes) == 1, outcome, " ".join(notes))  # fmt: skip
    run = k.fresh("pointer step flipped / resume")
    pointer = json.loads((run / "checkpoint.json").read_text())
    (run / "checkpoint.json").write_text(json.dumps(dict(pointer, step=9)))
    outcome = c.verb(c.train_argv(run, "3k", "--resume"))
    notes = [line for line in outcome.err.splitlines() if "recovered checkpoint.json" in line]
    k.check("checkpoint.json damaged / train --resume says the recovery", outcome.rc == 0 and len(notes) == 1, outcome)
    # item 3: advice that works
    out = c.root / "cases" / "set-lr" / "run"
    outcome = c.verb(c.train_argv(out, "2k", "--set", "lr=1e6"))
    advice = outcome.err.split("start again with a fix: drmlab ", 1)[-1].split(" (or --set")[0]
    again = c.verb(shlex.split(advice))
    lr = json.loads((out / "config.json").read_text())["train"]["lr"] if (out / "config.json").is_file() else None
    k.check("--set lr=1e6 diverges: the advised command trains at lr 1e5", outcome.rc == 1 and lr == 100000, again, f"lr {lr}")  # fmt: skip

    def edit_config(run: Path) -> None:
        config = json.loads((run / "config.json").read_text())
        config["train"]["eval_tokens"] = 64
        (run / "config.json").write_text(json.dumps(config))

    k.refused("edited config.json / report", lambda r: ["report", str(r)], "--accept-edited-config", edit_config)
    run = c.root / "cases" / "edited config.json / report" / "run"
    outcome = c.verb(["report", str(run), "--accept-edited-config"])
    k.check("edited config.json / report: the advice (--accept-edited-config)", outcome.rc == 0, outcome)
    for flags in ((), ("--overwrite",)):
        theirs = c.root / "cases" / f"theirs{len(flags)}"
        (theirs / "checkpoints" / "epoch-10").mkdir(parents=True)
        (theirs / "config.json").write_text('{"epochs": 10}')
        outcome = c.verb(c.train_argv(theirs, "1k", *flags))
        intact = (theirs / "config.json").read_text() == '{"epochs": 10}' and (theirs / "checkpoints/epoch-10").is_dir()
        ok = outcome.one_line_error and outcome.err.strip().endswith("give another --out") and intact
        k.check(f"another tool's folder / train {' '.join(flags)}".strip(), ok, outcome)
        again = c.verb(c.train_argv(theirs.with_name(theirs.name + "-another"), "1k", *flags))
        k.check(f"another tool's folder / train{''.join(' ' + f for f in flags)}: the advice (another --out)", again.rc == 0, again)  # fmt: skip
    # item 4: bad input in one line
    for flags in (("--temperature", "nan"), ("--temperature", "inf"), ("--top-p", "nan"), ("--top-k", "0")):
        outcome = c.verb(gen(pristine, *flags))
        k.check(f"generate {' '.join(flags)}", outcome.one_line_error and flags[0] in outcome.err and not outcome.out, outcome)  # fmt: skip
    out = c.root / "cases" / "eval-windows" / "run"
    t0 = time.perf_counter()
    outcome = c.verb(c.train_argv(out, "2k", "--set", "eval_windows=1000000"))
    seconds = time.perf_counter() - t0
    ok = outcome.one_line_error and "--set eval_windows=" in outcome.err and seconds < 60 and not out.exists()
    k.check("--set eval_windows=1000000", ok, outcome, f"{seconds:.1f} s")
    largest = outcome.err.split("--set eval_windows=", 1)[-1].split()[0] if ok else "0"
    again = c.verb(c.train_argv(out, "2k", "--set", f"eval_windows={largest}"))
    k.check("--set eval_windows=1000000: the advice (the largest)", again.rc == 0, again)
    return k.results


def main() -> int:
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="damage-campaign-"))
    c = Campaign(root, "SSM_CONTROL", shim=None)
    pristine = root / "pristine"
    first = c.verb(c.train_argv(pristine))
    if first.rc != 0:
        print(f"the finished run failed: {first.err}", file=sys.stderr)
        return 1
    results = run_cases(c, pristine)
    for r in results:
        print(("ok    " if r["ok"] else "FAILED") + f" {r['case']}: {r['said'] or r['why']}")
    failures = [r for r in results if not r["ok"]]
    print(f"damage campaign: {len(results)} cases, {len(failures)} failures ({time.perf_counter() - t0:.0f} s)")
    if not failures:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
