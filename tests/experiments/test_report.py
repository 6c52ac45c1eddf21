"""``drmlab report``: one self-contained HTML page for a run, an ablation, a loop study or an MQAR study.

The fixtures are real and small: a micro training run, a 2-model x 1-seed ablation, a 2-arm loop
study and a 1-cell MQAR study. The pages are checked as text (embedded PNGs that decode, no outside
resource, no script, every string from the files escaped) and, where Chromium is installed, in the
browser: every image decodes, no Content-Security-Policy violation or console message, and a
screenshot that shows the figures.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from drmlab.cli import main
from drmlab.experiments.report.html import PNG_MAGIC, markdown_html

HOSTILE = "<script>alert('x')</script> & \"quoted\""


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    """{kind: directory} of one real run and three real studies, all at preset micro."""
    root = tmp_path_factory.mktemp("report")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join((stdlib / n).read_text() for n in ("textwrap.py", "bisect.py", "colorsys.py")))
    data = ["--data", str(corpus), "--cache-dir", str(root / "cache"), "--eval-tokens", "512", "--quiet"]
    dirs = {kind: root / kind for kind in ("run", "ablate", "loop", "mqar")}
    assert (
        main(
            [
                "train",
                "--model",
                "J",
                "--preset",
                "micro",
                "--tokens",
                "1024",
                "--eval-every",
                "512",
                "--out",
                str(dirs["run"]),
                *data,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "ablate",
                "--models",
                "J,SSM_CONTROL",
                "--seeds",
                "1",
                "--preset",
                "micro",
                "--tokens",
                "512",
                "--set",
                "eval_every=256",
                "--out",
                str(dirs["ablate"]),
                *data,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "loop-study",
                "--arms",
                "C",
                "--seeds",
                "1",
                "--preset",
                "micro",
                "--tokens",
                "256",
                "--out",
                str(dirs["loop"]),
                *data,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "mqar",
                "--models",
                "SSM_CONTROL",
                "--kv",
                "2",
                "--seeds",
                "0",
                "--preset",
                "micro",
                "--steps",
                "2",
                "--batch-size",
                "4",
                "--n-train",
                "16",
                "--n-test",
                "16",
                "--out",
                str(dirs["mqar"]),
                "--quiet",
            ]
        )
        == 0
    )
    return dirs


@pytest.fixture(scope="module")
def pages(studies):
    """{kind: the text of ``drmlab report DIR``'s page} for every fixture directory."""
    out = {}
    for kind, directory in studies.items():
        assert main(["report", str(directory)]) == 0
        out[kind] = (directory / "report.html").read_text(encoding="utf-8")
    return out


def _report(directory: Path, capsys) -> str:
    capsys.readouterr()
    assert main(["report", str(directory)]) == 0
    page = directory / "report.html"
    assert capsys.readouterr().out.strip() == f"wrote {page}"
    return page.read_text(encoding="utf-8")


def _images(page: str) -> list[bytes]:
    """The embedded images, decoded; every <img> must be an embedded PNG."""
    sources = re.findall(r'<img [^>]*src="([^"]*)"', page)
    assert len(sources) == page.count("<img ")
    out = []
    for src in sources:
        assert src.startswith("data:image/png;base64,"), src[:60]
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert data.startswith(PNG_MAGIC)
        out.append(data)
    return out


def _self_contained(page: str) -> None:
    lowered = page.lower()
    assert "<script" not in lowered and "<link" not in lowered and "@import" not in lowered
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", lowered)
    assert "url(" not in lowered  # no style sheet fetches either
    assert "default-src 'none'" in page  # the policy that makes the browser refuse anything from outside


def test_run_page(studies, pages):
    page = pages["run"]
    _self_contained(page)
    assert len(_images(page)) == 2  # training curves and the DRM diagnostics
    for heading in (
        "Results",
        "Curves",
        "Sampled evaluations",
        "Checkpoint",
        "Configuration",
        "Data provenance",
        "Runtime",
    ):
        assert f"<h2>{heading}</h2>" in page
    summary = json.loads((studies["run"] / "summary.json").read_text())
    assert f"{summary['val_ce']:.6g}" in page and "Finished: 4 steps" in page
    pointer = json.loads((studies["run"] / "checkpoint.json").read_text())
    assert pointer["files"]["model.safetensors"]["sha256"] in page
    config = json.loads((studies["run"] / "config.json").read_text())
    assert config["data"]["content_sha256"] in page


def test_strings_from_the_files_are_escaped(studies, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    config = json.loads((studies["run"] / "config.json").read_text())
    config["data_source"] = HOSTILE
    config["overrides"] = {HOSTILE: HOSTILE}
    (run / "config.json").write_text(json.dumps(config))
    (run / "metrics.jsonl").write_text(
        json.dumps(
            {"kind": "resume", "step": 4, "changed": {"eval_tokens": [HOSTILE, None]}, "device": HOSTILE, "threads": 1}
        )
        + "\n"
    )
    page = _report(run, capsys)
    assert "<script" not in page.lower() and HOSTILE not in page
    assert page.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;quoted&quot;") >= 4


def test_ablation_page(studies, pages):
    page = pages["ablate"]
    _self_contained(page)
    assert len(_images(page)) == 2  # curves.png and seeds.png, drawn by ablate_report
    assert "<h2>Promotion gate verdicts</h2>" in page and "0 of 2 ordered pairs promoted" in page
    assert "only 1 paired seeds (needs 3)" in page
    results = json.loads((studies["ablate"] / "results.json").read_text())
    for model, stats in results["models"].items():  # the results.md table, rendered
        assert f"<td>{model}</td>" in page and f"{stats['ce_mean']:.4f} +- {stats['ce_std']:.4f}" in page
    assert page.count("<table>") >= 5  # results, per seed, gate, runs, settings
    assert "content_sha256" in page and "Runtime (the first run" in page


def test_loop_and_mqar_pages(pages):
    page = pages["loop"]
    _self_contained(page)
    assert page.startswith("<!DOCTYPE html>") and "<h1>Loop study: C</h1>" in page
    assert "<h2>Loop table</h2>" in page and len(_images(page)) == 3  # curves, seeds, loss against N

    page = pages["mqar"]
    _self_contained(page)
    assert "<h1>MQAR study: SSM_CONTROL</h1>" in page and len(_images(page)) == 1  # mqar.png
    assert "context guess (no binding)" in page


def test_out_file_and_bad_directories(studies, pages, tmp_path, capsys):
    target = tmp_path / "pages" / "mqar.html"
    capsys.readouterr()
    assert main(["report", str(studies["mqar"]), "--out", str(target)]) == 0
    assert capsys.readouterr().out == f"wrote {target}\n"
    assert target.read_text() == pages["mqar"]
    capsys.readouterr()
    (tmp_path / "empty").mkdir()
    for directory, message in (
        (tmp_path / "empty", "is neither a run directory"),
        (tmp_path / "absent", "does not exist"),
        (target, "is a file"),
    ):
        assert main(["report", str(directory)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("drmlab report: error: ") and message in err and err.count("\n") == 1


def test_gate_verdicts_name_the_promoted_pairs():
    from drmlab.experiments.ablate.protocol import summarize
    from drmlab.experiments.report.pages import _gate_verdicts
    from drmlab.experiments.stats import GATE_RULE

    runs = [
        {"model": m, "seed": s, "val_ce": ce, "val_bpb": ce, "params": 1, "tokens_per_s": None}
        for m, ces in (("A", (1.0, 1.01, 1.02)), ("B", (1.1, 1.1, 1.1)))
        for s, ce in zip((1, 2, 3), ces)
    ]
    _, gates = summarize(runs, ["A", "B"])
    text = _gate_verdicts({"gate": gates, "gate_rule": GATE_RULE})
    assert "wins on at least 2/3 of the pairs" in text and "1 of 2 ordered pairs promoted" in text
    assert '<span class="yes">promoted</span>: A over B (gain +0.0900 nats, wins 3/3)' in text


def test_markdown_subset():
    text = (
        "# Title\n\nSome `code` and **bold**, *em*.\n\n| a | b |\n|---|---:|\n| x <y> | 1 |\n\n* item one\n* item two\n"
    )
    html = markdown_html(text)
    assert "<h2>Title</h2>" in html
    assert "<p>Some <code>code</code> and <strong>bold</strong>, <em>em</em>.</p>" in html
    assert '<thead><tr><th>a</th><th class="num">b</th></tr></thead>' in html
    assert '<td>x &lt;y&gt;</td><td class="num">1</td>' in html
    assert "<ul><li>item one</li><li>item two</li></ul>" in html


# ---------------------------------------------------------------- in a real browser

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
# Injected into a copy of the page (its hash added to the page's policy): after loading, it writes how many
# images there are, how many did not decode and how many policy violations the browser reported.
CHECK_SCRIPT = (
    "var violations=0;document.addEventListener('securitypolicyviolation',function(){violations++;});"
    "window.addEventListener('load',function(){var images=Array.prototype.slice.call(document.images);"
    "var broken=images.filter(function(i){return !(i.complete&&i.naturalWidth>0);}).length;"
    "document.body.setAttribute('data-check','images='+images.length+';broken='+broken+"
    "';violations='+violations);});"
)


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run(
        [shutil.which("chromium"), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (apt-get install chromium)")
def test_pages_in_a_headless_browser(pages, tmp_path):
    import matplotlib.image

    digest = base64.b64encode(hashlib.sha256(CHECK_SCRIPT.encode()).digest()).decode()
    for kind in ("run", "ablate"):
        page = pages[kind]
        checked = page.replace("default-src 'none';", f"default-src 'none'; script-src 'sha256-{digest}';", 1).replace(
            "<head>", f"<head><script>{CHECK_SCRIPT}</script>", 1
        )
        assert checked.count(digest) == 1 and checked.count(CHECK_SCRIPT) == 1
        (tmp_path / f"{kind}.html").write_text(checked)
        shot = tmp_path / f"{kind}.png"
        done = _chromium(
            tmp_path,
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1000,1400",
            f"--screenshot={shot}",
            "--dump-dom",
            (tmp_path / f"{kind}.html").as_uri(),
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert f'data-check="images={page.count("<img ")};broken=0;violations=0"' in done.stdout, done.stdout[-300:]
        assert [line for line in done.stderr.splitlines() if ":CONSOLE" in line] == []
        pixels = (matplotlib.image.imread(str(shot))[..., :3] * 255).round()
        assert pixels.std() > 20  # not blank
        # the page itself is grey on white: strongly coloured pixels are the figures' curves and bars
        assert ((pixels.max(axis=-1) - pixels.min(axis=-1)) > 80).sum() > 500


def _damaged_copy(studies, tmp_path, damage: str) -> Path:
    """A copy of the fixture run with one kind of checkpoint damage."""
    run = tmp_path / "run"
    shutil.copytree(studies["run"], run)
    pointer = json.loads((run / "checkpoint.json").read_text())
    folder = run / pointer["dir"]
    if damage in ("optimizer.safetensors", "model.safetensors", "trainer_state.json"):
        data = bytearray((folder / damage).read_bytes())
        data[len(data) // 2] ^= 0x04
        (folder / damage).write_bytes(bytes(data))
    elif damage == "deleted weights":
        (folder / "model.safetensors").unlink()
    elif damage == "lost pointer":
        (run / "checkpoint.json").unlink()
    elif damage == "garbled pointer":
        (run / "checkpoint.json").write_text('{"dir": [')
    else:  # pointer and manifest both garbled: nothing left to recover from
        (run / "checkpoint.json").write_text('{"dir": [')
        (folder / "manifest.json").write_text("[1]")
    return run


@pytest.mark.parametrize(
    "damage, status",
    [
        ("optimizer.safetensors", r"Checkpoint damaged: \S*optimizer\.safetensors does not match its recorded sha256"),
        ("model.safetensors", r"Checkpoint damaged: \S*model\.safetensors does not match its recorded sha256"),
        ("trainer_state.json", r"Checkpoint damaged: \S*trainer_state\.json does not match its recorded sha256"),
        ("deleted weights", r"Checkpoint damaged: \S*model\.safetensors is missing"),
        ("lost pointer", r"Checkpoint at step 4 recovered from its manifest: checkpoint\.json is missing; "),
        ("garbled pointer", r"Checkpoint at step 4 recovered from its manifest: checkpoint\.json is damaged; "),
        (
            "nothing to recover",
            r"Checkpoint damaged: \S*checkpoint\.json is not valid JSON; the file is damaged; and no",
        ),
    ],
)
def test_the_run_page_states_a_damaged_or_recovered_checkpoint(studies, tmp_path, capsys, damage, status):
    """Before the fix, the page verified only trainer_state.json, so damaged weights or optimizer state went
    unmentioned (and a damaged pointer could raise). Every file is verified; the page says what it found in its
    status line and its Checkpoint section, renders everything else, and changes no file."""
    run = _damaged_copy(studies, tmp_path, damage)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "report.html"}
    page = _report(run, capsys)
    assert capsys.readouterr().err == ""
    status_line = re.search(r"<p[^>]*>((Finished|Interrupted)[^<]*)</p>", page).group(1)
    assert re.search(status, status_line.replace("&#x27;", "'")), status_line
    assert "\n" not in status_line and "Traceback" not in page
    checkpoint = page.split("<h2>Checkpoint</h2>", 1)[1].split("<h2>", 1)[0]
    if damage in ("lost pointer", "garbled pointer"):
        assert "Recovered: checkpoint.json is" in checkpoint and "every file of that folder verified" in checkpoint
        manifest = json.loads(next(run.glob("checkpoints/*/manifest.json")).read_text())
        assert manifest["files"]["optimizer.safetensors"]["sha256"] in checkpoint
    else:
        assert "Damaged: " in checkpoint and "verified" not in checkpoint
    for heading in ("Results", "Curves", "Sampled evaluations", "Configuration", "Data provenance", "Runtime"):
        assert f"<h2>{heading}</h2>" in page
    assert len(_images(page)) == 2
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "report.html"}
    assert after == before  # the report repairs nothing and deletes nothing


def test_the_run_page_says_an_intact_checkpoint_verified(pages):
    status_line = re.search(r"<p>(Finished[^<]*)</p>", pages["run"]).group(1)
    assert status_line.endswith("Checkpoint at step 4 verified: every file matches its sha256.")
    assert "Every file verified (size and sha256)." in pages["run"]


@pytest.mark.parametrize("name", ["summary.json", "eval.json"])
def test_a_damaged_output_file_is_stated_and_the_page_still_drawn(studies, tmp_path, capsys, name):
    """summary.json and eval.json carry no checksum: a damaged one made the page refuse. Now it says so
    (naming the file) and renders the rest, changing no file."""
    run = tmp_path / "run"
    shutil.copytree(studies["run"], run)
    (run / name).write_text('{"finished": tr')
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "report.html"}
    page = _report(run, capsys)
    assert capsys.readouterr().err == ""
    assert re.search(rf"Damaged: \S*{re.escape(name)} is not valid JSON", page)
    for heading in ("Results", "Curves", "Checkpoint", "Configuration"):
        assert f"<h2>{heading}</h2>" in page
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "report.html"}
    assert after == before
