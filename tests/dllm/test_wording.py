"""The project speaks of itself by version and date: no tracked file outside tests/ talks about work
sessions, tracker issues, "the bar" or "this machine", and no tracked path carries a session suffix
(`-s36`). Tests are exempt (pytest's own `scope="session"`)."""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "session": re.compile(r"\bsessions?\b", re.I),
    "tracker issue": re.compile(r"\bissues?\s*#?\d+|\bissue's\b|\bthe issue\b", re.I),
    "the bar": re.compile(r"\b(?:the|quality|RL|speed|teacher|student)\s+bars?\b|\bbars?\s+(?:is\s+|are\s+|was\s+)?met\b",
                          re.I),
    "this machine": re.compile(r"\bthis machine\b", re.I),
}
SESSION_SUFFIX = re.compile(r"(?:^|[-_/.])s\d{1,2}(?=[-_/.]|$)")
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".json", ".jsonl", ".txt", ".sh", ".toml", ".cfg", ".jinja", ".csv", ""}


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs a git checkout")
    return [p for p in out.splitlines() if (REPO / p).is_file()]


def test_no_session_or_tracker_words_outside_tests():
    hits = []
    for rel in _tracked():
        path = REPO / rel
        if rel.startswith("tests/") or path.suffix not in TEXT_SUFFIXES or path.stat().st_size > 5_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for name, rx in FORBIDDEN.items():
            for m in rx.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                hits.append(f"{rel}:{line}: {name}: {m.group(0)!r}")
    assert not hits, "\n".join(hits[:50]) + (f"\n... {len(hits) - 50} more" if len(hits) > 50 else "")


def test_no_session_suffixes_in_paths():
    bad = [p for p in _tracked() if SESSION_SUFFIX.search(p.removeprefix("tests/").lower())]
    assert not bad, bad[:50]


@pytest.mark.parametrize("text,name", [
    ("measured in session 36", "session"), ("Sessions 2-4", "session"), ("see issue #7", "tracker issue"),
    ("the issue's target", "tracker issue"), ("the bar is met", "the bar"), ("quality bar", "the bar"),
    ("on this machine", "this machine"),
])
def test_the_patterns_catch_what_they_name(text, name):
    assert FORBIDDEN[name].search(text)


@pytest.mark.parametrize("text", ["a progress bar", "barrier", "the sessionless server", "issues a request"])
def test_the_patterns_leave_ordinary_words(text):
    assert not any(rx.search(text) for rx in FORBIDDEN.values())


def test_the_suffix_pattern():
    assert SESSION_SUFFIX.search("docs/results/quality-tiny-s36.json")
    assert SESSION_SUFFIX.search("recipes/resume/tiny-sft-s8/x")
    assert not SESSION_SUFFIX.search("docs/results/lopa-ceiling-B8.json")
    assert not SESSION_SUFFIX.search("docs/results/quality-tiny-2026-12-05-seed1.json")
