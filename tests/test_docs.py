"""README and docs/ do not rot, and no tracked text says how the project was made.

- Every relative link in README.md and docs/*.md names a file that exists (the anchor after `#` is not checked).
- Every `cooper SUBCOMMAND --flag` that README shows, in a code block or inline code, exists in that subcommand's
  `--help`.
- Every measured figure README quotes in its prose and tables (a decimal, or a count of seconds, minutes, items/s, ms,
  x or %) is held, with its unit and to README's digits, by the doc section its paragraph names in FIGURE_SOURCES:
  README quotes, the docs hold the result with its command and machine, so the two cannot drift apart (a figure
  anywhere in docs/ would not do: most numbers occur there somewhere). Code blocks (a command's sample output) and
  link targets are left out.
- No tracked text file carries words about the work rather than the product: numbered work sessions or tickets, a
  machine-local path. Each hit fails with `file:line: text`; such notes belong in commit messages.

Each checker is a plain function, also run on planted text so that none of them passes by finding nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# --- links -------------------------------------------------------------------------------------------------------

FENCE = re.compile(r"^```.*?^```", flags=re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def broken_links(path: Path, text: str | None = None) -> list[str]:
    """`path:line: target` for each relative link of a markdown file whose target does not exist."""
    text = path.read_text() if text is None else text
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # keep line numbers; code holds no links
    problems = []
    for match in LINK.finditer(prose):
        target = match.group(1)
        if re.match(r"[a-z][a-z+.-]*:", target) or target.startswith("#"):  # https:, mailto:, an anchor here
            continue
        if not (path.parent / target.split("#", 1)[0]).exists():
            line = prose.count("\n", 0, match.start()) + 1
            problems.append(f"{path.relative_to(ROOT)}:{line}: {target}")
    return problems


def test_every_relative_link_resolves():
    assert [p for doc in DOCS for p in broken_links(doc)] == []


def test_a_broken_link_is_reported():
    text = "See [the design](docs/design.md), [gone](docs/gone.md#x), [site](https://example.org).\n"
    assert broken_links(ROOT / "README.md", text) == ["README.md:1: docs/gone.md#x"]


# --- README's figures ----------------------------------------------------------------------------------------------

FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(x\b|%| s\b| minutes\b| items/s\b| ms\b)?")

# Where each README paragraph or table with figures has them from: its opening words -> the doc sections (file,
# the start of the heading) that hold every figure it quotes, with the same unit, to the digits README gives (README's
# 0.57x is a section's 0.567x). A paragraph with figures and no entry fails, as does an entry no paragraph opens with.
FIGURE_SOURCES: dict[str, list[tuple[str, str]]] = {
    "Each installs the exact versions": [("docs/development.md", "## The three commands")],
    "It loads the tiny tokenizer": [("docs/benchmarks.md", "## The README's commands, timed")],
    "It prints pytest's progress": [("docs/benchmarks.md", "## The README's commands, timed")],
    "In a virtual environment of their own, vLLM's": [("docs/development.md", "## The three commands")],
    "Its tests took": [("docs/benchmarks.md", "## The README's commands, timed")],
    "`cooper train --config smol-rule`": [("docs/experiments.md", "## A real pretrained model, SmolLM2")],
    "The tiny preset's VerifyRM (`tiny-rm-keyed`)": [("docs/experiments.md", "## A gentler VerifyRM")],
    "| mode | held-out accuracy": [("docs/experiments.md", "## A cheaper VerifyRM update")],
    '`"reproduced": true` on judged seeds': [("docs/experiments.md", "## A cheaper VerifyRM update"),
                                             ("docs/experiments.md", "## A gentler VerifyRM"),
                                             ("docs/experiments.md", "## The finding on a second CPU kind"),
                                             ("docs/experiments.md", "## The finding through TRL")],
    "Every static and cooper run watches": [("docs/experiments.md", "## The alarm on real runs that set nothing"),
                                            ("docs/alarm.md", "")],
    "The paper presets (`qwen2.5-1.5b-rule`": [("docs/training.md", "")],
    "`run.max_staleness=1` samples": [("docs/experiments.md", "## A cheaper VerifyRM update"),
                                      ("docs/benchmarks.md", "## Rollouts one step ahead of training"),
                                      ("docs/benchmarks.md", "## Where a cooper step's time goes")],
    "| server | items/s | p99 ms": [("docs/benchmarks.md", "## The reward API against every peer, its defaults")],
    "The same bench serving a real model's VerifyRM": [("docs/benchmarks.md", "## A real model served by every peer")],
    "| server, SmolLM2-135M VerifyRM": [("docs/benchmarks.md", "## A real model served by every peer")],
    "On the real model vLLM leads": [("docs/benchmarks.md", "## A real model served by every peer")],
    "`cooper serve reward` with nothing set": [("docs/reward-api.md", "## The serving settings"),
                                                ("docs/benchmarks.md", "## The reward API against every peer, its"),
                                                ("docs/benchmarks.md", "## The reward API against every peer at its best")],
    "Licensed under the Apache License": [("LICENSE", "")],
}


def prose_of(markdown: str) -> str:
    """The text figures are read from: code blocks blanked (line numbers kept), link targets and the paper's id out."""
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), markdown)
    prose = LINK.sub(lambda m: m.group(0).replace(m.group(1), ""), prose)  # link targets: addresses, file names
    return re.sub(r"arXiv:? ?\d{4}\.\d{4,5}", "arXiv", prose)


def figures_of(text: str) -> list[tuple[str, str | None]]:
    """(number, unit) of each figure: a decimal or a number with a unit (a bare integer, a count of seeds or steps,
    is not a figure here)."""
    return [(m.group(1), m.group(2)) for m in FIGURE.finditer(text) if "." in m.group(1) or m.group(2)]


def paragraphs(markdown: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph or table: runs of lines between blank lines and headings."""
    found, lines, first = [], [], 0
    for number, line in enumerate([*markdown.split("\n"), ""], 1):
        if line.strip() and not line.startswith("#"):
            first = first if lines else number
            lines.append(line)
        elif lines:
            found.append((first, "\n".join(lines)))
            lines = []
    return found


def section(markdown: str, heading: str) -> str:
    """The text under the first heading that starts with `heading`, up to the next heading ("": the whole file)."""
    if not heading:
        return markdown
    match = re.search(rf"^{re.escape(heading)}.*?$(.*?)(?=^#|\Z)", markdown, flags=re.M | re.S)
    assert match, f"no heading starting {heading!r}"
    return match.group(1)


def holds(text: str, number: str, unit: str | None) -> bool:
    """Whether `text` has a figure of the same unit that, rounded to the digits of `number`, is `number`."""
    digits = len(number.partition(".")[2])
    return any(u == unit and len(n.partition(".")[2]) >= digits and round(float(n), digits) == float(number)
               for n, u in figures_of(text))


def unsourced_figures(readme: str, sources: dict[str, list[tuple[str, str]]], read: Callable[[str], str]) -> list[str]:
    """`line: figure` for each figure of README's prose that the sources of its paragraph do not hold, `line: ...`
    for a paragraph with figures and no sources, and each source no paragraph opens with. `read(path)`: a doc."""
    problems, used = [], set()
    for line, text in paragraphs(prose_of(readme)):
        figures = figures_of(text)
        opening = next((key for key in sources if text.startswith(key)), None)
        if opening is None:
            problems += [f"{line}: {text[:40]}... has figures and no sources"] if figures else []
            continue
        used.add(opening)
        held = [section(prose_of(read(path)), heading) for path, heading in sources[opening]]
        problems += [f"{line}: {n}{u or ''}" for n, u in figures if not any(holds(t, n, u) for t in held)]
    return problems + [f"a source for a paragraph that is not there: {key}" for key in sources if key not in used]


def test_every_figure_readme_quotes_is_in_the_section_it_comes_from():
    problems = unsourced_figures((ROOT / "README.md").read_text(), FIGURE_SOURCES, lambda p: (ROOT / p).read_text())
    assert problems == []


def test_a_figure_its_sources_do_not_hold_is_reported():
    readme = ("Intro (arXiv 2508.05613).\n\nIt took 12.5 s on 4 cores, [paper](https://arxiv.org/abs/2508.05613)."
              "\n\n```\n9.99\n```\nIt was 0.731x, 47 s.\n\nUnsourced 0.5.\n")
    docs = {"a.md": "# A\nmeasured 12.5 s\n## B\n0.7312x in 47 s\n## C\n0.74x, 52 s, 12.5 s\n"}
    sources = {"It took": [("a.md", "# A")], "It was": [("a.md", "## C")], "Gone": [("a.md", "")]}
    assert unsourced_figures(readme, sources, docs.__getitem__) == [
        "8: 0.731x", "8: 47 s", "10: Unsourced 0.5.... has figures and no sources",
        "a source for a paragraph that is not there: Gone"]
    sources["It was"] = [("a.md", "## B")]  # to README's digits, with its unit
    assert unsourced_figures(readme, sources, docs.__getitem__)[:2] == ["10: Unsourced 0.5.... has figures and no "
                                                                        "sources", "a source for a paragraph that is "
                                                                        "not there: Gone"]


# --- README's cooper commands ------------------------------------------------------------------------------------

def readme_commands(text: str) -> list[tuple[str, list[str]]]:
    """(subcommand, flags) of every `cooper ...` command in README's code: fenced blocks, line by line with `\\`
    continuations joined and comments dropped, and inline code spans that start with `cooper `."""
    lines: list[str] = []
    for block in FENCE.findall(text):
        body = "\n".join(block.splitlines()[1:-1]).replace("\\\n", " ")
        lines += [line.split(" # ", 1)[0].split("  #", 1)[0] for line in body.splitlines()]
    lines += re.findall(r"(?<!`)`(cooper [^`]+)`", FENCE.sub("", text))
    commands = []
    for line in lines:
        # `cooper` in command position: at the start, or after && ; | (not `kubectl -n cooper wait`).
        for match in re.finditer(r"(?:^|&&|;|\|)\s*cooper\s+([a-z][a-z-]*)([^&;|]*)", line):
            flags = [token.split("=", 1)[0] for token in match.group(2).split() if re.match(r"--?[A-Za-z]", token)]
            commands.append((match.group(1), flags))
    return commands


def cooper_help(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "cooper.cli", *args, "--help"], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def unknown_options(commands: list[tuple[str, list[str]]]) -> list[str]:
    """What README shows that `cooper --help` and `cooper SUBCOMMAND --help` do not know."""
    top = cooper_help()
    subcommands = set(re.findall(r"^ {4}([a-z][a-z-]*)(?: |$)", top, flags=re.M))  # argparse's COMMAND list
    helps = {name: cooper_help(name) for name in sorted({name for name, _ in commands} & subcommands)}
    problems = [f"cooper {name}: no such subcommand" for name, _ in commands if name not in subcommands]
    for name, flags in commands:
        problems += [f"cooper {name} {flag}: not in `cooper {name} --help`" for flag in flags
                     if name in helps and not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[name])]
    return problems


def test_every_cooper_command_in_the_readme_exists():
    commands = readme_commands((ROOT / "README.md").read_text())
    # The scan finds what README shows (the first command, the paper-scale path), so an empty list cannot pass.
    assert ("train", []) in commands and ("pretrain-rm", ["-o", "--config"]) in commands, commands
    assert unknown_options(commands) == []


def test_an_unknown_flag_or_subcommand_is_reported():
    planted = ("```bash\npip install x && cooper train --no-such-flag run.steps=2\n"
               "cooper frobnicate --config a.yaml\nkubectl -n cooper wait --for=condition=complete\n```\n"
               "Then `cooper data in.jsonl -o out.jsonl`.\n")
    commands = readme_commands(planted)
    assert commands == [("train", ["--no-such-flag"]), ("frobnicate", ["--config"]), ("data", ["-o"])]
    assert unknown_options(commands) == ["cooper frobnicate: no such subcommand",
                                         "cooper train --no-such-flag: not in `cooper train --help`"]



PAPER_PRESET = "qwen2.5-1.5b-cooper"
CONFIGURED = ("annotate", "pretrain-rm", "eval-rm", "train")
"""The subcommands that read a config: without --config they load the tiny preset (reward.max_length 256, the
verifier's boxed-only answers), which would quietly truncate and relabel paper-scale triples."""


def unconfigured_paper_commands(text: str, heading: str) -> list[str]:
    """The `cooper annotate|pretrain-rm|eval-rm|train` commands in the code blocks of the section under `heading`
    (up to the next heading) that do not name the paper preset with --config."""
    lines, fenced = [], False
    for line in text.split(heading, 1)[1].splitlines()[1:]:
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:  # the next heading; a `#` inside a code block is a comment
            break
        lines.append(line)
    problems = []
    for block in FENCE.findall("\n".join(lines) + "\n"):
        body = "\n".join(block.splitlines()[1:-1]).replace("\\\n", " ")
        for line in body.splitlines():
            match = re.match(r"\s*cooper\s+([a-z-]+)\s(.*)", line.split(" # ", 1)[0])
            if match and match.group(1) in CONFIGURED and "--resume" not in line \
                    and not re.search(rf"--config\s+(configs/)?{re.escape(PAPER_PRESET)}(\.yaml)?(\s|$)", line):
                problems.append(" ".join(line.split()))
    return problems


@pytest.mark.parametrize(("doc", "heading"), [("README.md", "## On GPUs, at the paper's scale"),
                                              ("docs/training.md", "### The initial VerifyRM")])
def test_every_paper_scale_command_runs_with_the_paper_preset(doc, heading):
    text = (ROOT / doc).read_text()
    assert heading in text
    assert unconfigured_paper_commands(text, heading) == []


def test_a_paper_scale_command_without_the_preset_is_reported():
    planted = ("## On GPUs, at the paper's scale\n```bash\ncooper pretrain-rm l.jsonl -o m \\\n    reward.model=x\n"
               "cooper data a.jsonl -o b.jsonl\ncooper train --config qwen2.5-1.5b-cooper reward.model=m\n```\n"
               "## Next\n```bash\ncooper train\n```\n")
    assert unconfigured_paper_commands(planted, "## On GPUs, at the paper's scale") == [
        "cooper pretrain-rm l.jsonl -o m reward.model=x"]

# --- words about how the project was made ------------------------------------------------------------------------

# Built from pieces, so that this file does not match its own patterns.
PROCESS_WORDS = [re.compile(pattern, flags=re.I) for pattern in (
    r"\b" + "sess" + r"ions?\s+#?\d+",          # numbered work sessions
    r"\bthis " + "sess" + r"ion\b",
    r"\b" + "iss" + r"ues?\s+#?\d+",            # numbered tickets
    r"\bthe " + "iss" + r"ue's\b|\bof the " + "iss" + r"ue\b",
    r"\bhelper " + r"agents?\b",
    r"\bpeople who " + r"steer\b",
    r"\banother " + r"engineer'?s?\b",        # who else used the machine
    r"\ba note kept " + r"on the machine\b",
    r"\bto free the " + r"machine\b",
    r"\bamendment " + r"log\b",
    r"(?<![\w.])/" + r"work/",                  # machine-local paths
    r"/" + r"home/(?!cooper\b)\w+",             # (the images' user is cooper)
)]
TEXT_SUFFIXES = {".md", ".py", ".pyi", ".yaml", ".yml", ".toml", ".txt", ".sh", ".cfg", ".ini", ".json", ".proto",
                 ".example", ".dockerignore", ".Dockerfile", ".env"}
VENDORED = {"tests/deploy/compose-spec.json"}  # the compose specification, as published


def process_words(name: str, text: str) -> list[str]:
    """`name:line: text` for each line that says how the work was organised. A phrase broken across two lines of
    prose counts too: it is matched with the line break read as a space."""
    flat = text.replace("\n", " ")
    problems = []
    for pattern in PROCESS_WORDS:
        for match in pattern.finditer(flat):
            line = text.count("\n", 0, match.start()) + 1
            problems.append(f"{name}:{line}: {text.splitlines()[line - 1].strip()}")
    return sorted(set(problems))


def tracked_text_files() -> list[str]:
    try:
        listed = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    names = []
    for name in listed.stdout.splitlines():
        path = ROOT / name
        if name in VENDORED or "_pb2" in name or not path.is_file():
            continue
        if path.suffix in TEXT_SUFFIXES or path.name in {"Dockerfile", "run", "LICENSE"} or name.startswith(".ci/"):
            names.append(name)
    return names


def test_no_tracked_text_says_how_it_was_made():
    names = tracked_text_files()
    assert "README.md" in names and "cooper/cli.py" in names and ".ci/run" in names
    assert [p for name in names for p in process_words(name, (ROOT / name).read_text())] == []


def test_words_about_the_work_are_reported_with_their_line():
    planted = "A run.\nMeasured in " + "Sess" + "ion\n14 on a\nquiet machine; see " + "iss" + "ue #25.\n"
    planted += "Copied from /" + "work/notes.txt. A gRPC " + "sess" + "ion and an HTTP " + "sess" + "ion are fine.\n"
    planted += "Stopped to free the " + "machine for CI.\n"
    assert process_words("x.md", planted) == [
        "x.md:2: Measured in " + "Sess" + "ion",
        "x.md:4: quiet machine; see " + "iss" + "ue #25.",
        "x.md:5: Copied from /" + "work/notes.txt. A gRPC " + "sess" + "ion and an HTTP " + "sess" + "ion are fine.",
        "x.md:6: Stopped to free the " + "machine for CI.",
    ]
