"""A public library's real history, replayed as a team's main branch: is each red build a
regression, and each green one not?

    python benchmarks/public_history.py --upstream DIR [--commits 14] [--until REV]
        [--out benchmarks/data/public_history_roundN.json] [--ab]

``DIR`` is a git clone of lucidrains/x-transformers (``fetch github:lucidrains/x-transformers``).
The project is four CPU benchmarks on the library's decoder (inference, a training step
with AdamW, a padded batch with its mask, an encoder's forward; ``PROJECT_TESTS``). The last
``--commits`` upstream commits that touched ``x_transformers/`` (up to ``--until``) are
committed into the project one after the other, as a main branch receives them; each is one
``pytest --perfguard --perfguard-save`` session in store mode, history building up, as CI on
main would run it.

Per commit it prints the session's exit status, badge and each test's outcome, gates and
culprit line. With ``--ab``, every test a session did not pass green is measured again in A/B
mode against its parent commit, on this machine: what the build *should* have said.
A plain ``pytest`` of the same tests is timed at the first and last commits (the cost
of a perfguard session beside it). Writes everything as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from history_repo import git  # noqa: E402

from perfguard.compare.results import load_results  # noqa: E402

PROJECT_TESTS = """\
import pytest
import torch
from x_transformers import Decoder, Encoder, TransformerWrapper

SEQ, BATCH = 128, 4


def decoder():
    torch.manual_seed(0)
    return TransformerWrapper(
        num_tokens=256, max_seq_len=SEQ, attn_layers=Decoder(dim=128, depth=2, heads=4)
    )


@pytest.mark.gpuprofile(iterations=5, warmup=2)
def test_decoder_inference(gpuprofile):
    model, x = decoder().eval(), torch.randint(0, 256, (BATCH, SEQ))
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            model(x)


@pytest.mark.gpuprofile(iterations=5, warmup=2)
def test_decoder_train_step(gpuprofile):
    model, x = decoder(), torch.randint(0, 256, (BATCH, SEQ))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in gpuprofile.iterations():
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x)
        loss.backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.gpuprofile(iterations=5, warmup=2)
def test_decoder_padded(gpuprofile):
    # a padded batch: the mask paths (rows entirely masked out, key padding) run too
    model, x = decoder().eval(), torch.randint(0, 256, (BATCH, SEQ))
    mask = torch.ones(BATCH, SEQ, dtype=torch.bool)
    mask[1:, SEQ // 2 :] = False
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            model(x, mask=mask)


@pytest.mark.gpuprofile(iterations=5, warmup=2)
def test_encoder(gpuprofile):
    torch.manual_seed(0)
    model = TransformerWrapper(
        num_tokens=256, max_seq_len=SEQ, attn_layers=Encoder(dim=128, depth=2, heads=4)
    ).eval()
    x = torch.randint(0, 256, (BATCH, SEQ))
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            model(x)
"""

FLAGS = ["--perfguard", "--perfguard-backend=cpu", "--perfguard-store=store.db"]


def upstream_commits(upstream: Path, n: int, until: str) -> list[str]:
    """The last ``n`` commits that touched the library's package, oldest first."""
    out = git(upstream, "log", "--format=%H", f"-{n}", until, "--", "x_transformers/")
    return list(reversed(out.split()))


def take(upstream: Path, sha: str, root: Path) -> str:
    """The project's copy of the library at ``sha``; returns the upstream subject line."""
    shutil.rmtree(root / "x_transformers", ignore_errors=True)
    archive = subprocess.run(
        ["git", "-C", str(upstream), "archive", sha, "x_transformers"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return git(upstream, "log", "-1", "--format=%s", sha).strip()


def run(root: Path, *extra: str, plain: bool = False) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    t0 = time.perf_counter()
    done = subprocess.run(
        [*command, *([] if plain else FLAGS), *extra],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    return time.perf_counter() - t0, done.returncode, done.stdout[-6000:]


def verdicts(root: Path, out: str) -> dict[str, Any]:
    doc = load_results(root / out / "results.json")
    tests = {}
    for t in doc.tests:
        tests[t.nodeid.rsplit("::", 1)[-1]] = {
            "outcome": t.outcome.value,
            "gates": t.gates.outcome.value if t.gates is not None else None,
            "timing": t.timing.outcome.value if t.timing is not None else None,
            "change": t.timing.delta_pct if t.timing is not None else None,
            "headline": t.explanation.headline if t.explanation is not None else t.message,
        }
    return {"badge": f"{doc.badge()}: {doc.badge_reason()}", "tests": tests}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", type=Path, required=True)
    ap.add_argument("--commits", type=int, default=14)
    ap.add_argument("--until", default="HEAD")
    ap.add_argument("--ab", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--keep", type=Path, help="build the project here and keep it")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="perfguard-public-")) / "proj"
    root.mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "tests" / "test_decoder.py").write_text(PROJECT_TESTS)
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\ntestpaths = tests\n")
    (root / ".gitignore").write_text(".perfguard*/\nstore.db*\n__pycache__/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "ci@example.com")
    git(root, "config", "user.name", "CI")
    shas = upstream_commits(args.upstream, args.commits + 1, args.until)
    rows: list[dict[str, Any]] = []
    plain: list[float] = []
    for i, sha in enumerate(shas):
        subject = take(args.upstream, sha, root)
        git(root, "add", "-A")
        git(root, "commit", "-q", "--allow-empty", "-m", f"{sha[:10]} {subject}")
        if i in (0, len(shas) - 1):
            plain.append(round(run(root, plain=True)[0], 2))
        out = f".perfguard-{i:02d}"
        wall, rc, tail = run(root, "--perfguard-save", f"--perfguard-output={out}")
        row: dict[str, Any] = {
            "upstream": sha[:10],
            "subject": subject[:100],
            "exit": rc,
            "seconds": round(wall, 1),
            "load": round(os.getloadavg()[0], 2),
            **verdicts(root, out),
        }
        if args.ab and i > 0:
            judged = [n for n, t in row["tests"].items() if t["outcome"] not in ("unchanged",)]
            if judged:
                k = f"{out}-ab"
                ab_wall, ab_rc, _ = run(
                    root,
                    "--perfguard-against=HEAD~1",
                    f"--perfguard-output={k}",
                    "-k",
                    " or ".join(judged),
                )
                row["ab"] = {"exit": ab_rc, "seconds": round(ab_wall, 1), **verdicts(root, k)}
        rows.append(row)
        first = "" if i else " (the first run: nothing to compare)"
        print(f"[{i:2d}] {sha[:10]} exit {rc} {wall:5.1f} s {row['badge']}{first}", flush=True)
        for name, t in row["tests"].items():
            print(f"     {name}: {t['outcome']} (gates {t['gates']}) {t['headline'][:160]}")
        if "ab" in row:
            for name, t in row["ab"]["tests"].items():
                print(f"     A/B {name}: {t['outcome']} {t['change']}")
        if i == 0:
            print(tail[-1500:])
    judged = rows[1:]
    red = [r for r in judged if r["exit"] != 0]
    summary = {
        "commits": len(judged),
        "red": len(red),
        "red_confirmed_by_ab": sum(
            1
            for r in red
            if any(t["outcome"] == "regressed" for t in r.get("ab", {}).get("tests", {}).values())
        ),
        "verdicts": sum(len(r["tests"]) for r in judged),
        "regressed": sum(
            1 for r in judged for t in r["tests"].values() if t["outcome"] == "regressed"
        ),
        "noisy": sum(1 for r in judged for t in r["tests"].values() if t["outcome"] == "noisy"),
        "plain_pytest_s": plain,
        "perfguard_s": [r["seconds"] for r in rows],
        "load": os.getloadavg(),
    }
    print(json.dumps(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
