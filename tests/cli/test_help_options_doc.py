"""docs/options.md's option table and `moe_rt --help` list the same options, and the same values
for the options that take one of a fixed set: an option (or a value) in one but not the other
fails."""
import os
import re
import subprocess

import pytest
from mpi_launch import launcher, run_env  # tests/mpi_launch.py, on the path by conftest.py

OPTIONS_DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                           "options.md")
OPTION = re.compile(r"--[a-z][a-z0-9-]*")
# Options whose bad value is refused with "(valid: a, b, c)": every value named there must be in
# the option's --help entry and in its row of docs/options.md.
CHOICE_OPTIONS = ["--model", "--score-func", "--balance-loss-form", "--force-balance", "--data",
                  "--drop-policy", "--capacity-unit", "--data-order"]


@pytest.fixture(scope="module")
def help_text(moe_rt_bin):
    proc = subprocess.run(launcher(1) + [moe_rt_bin, "--help"], env=run_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def help_entries(text):
    """{"--name": its whole entry, continuation lines joined}. An entry starts with exactly two
    spaces and "--"; boost indents its wrapped lines further, and a blank line ends a section."""
    entries, current = {}, None
    for line in text.splitlines():
        m = re.match(r"  (--[a-z][a-z0-9-]*)", line)
        if m:
            current = m.group(1)
            entries[current] = line.strip()
        elif current and line.startswith("   "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def doc_rows():
    """{"--name": the row's meaning cell} for every option in the first cell of a row of a table
    of docs/options.md."""
    with open(OPTIONS_DOC, encoding="utf-8") as f:
        text = f.read()
    rows = {}
    for line in text.splitlines():
        if not line.startswith("| `--"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for name in OPTION.findall(cells[0]):
            rows[name] = " | ".join(cells[1:])
    return rows


def test_options_doc_and_help_list_the_same_options(help_text):
    in_help = set(help_entries(help_text))
    in_doc = set(doc_rows())
    assert len(in_help) > 40, f"--help parsed to only {sorted(in_help)}"
    missing = sorted(in_help - in_doc)
    assert not missing, f"in --help, missing from docs/options.md's table: {missing}"
    extra = sorted(in_doc - in_help)
    assert not extra, f"in docs/options.md's table, not in --help: {extra}"


@pytest.mark.parametrize("option", CHOICE_OPTIONS)
def test_every_valid_value_is_in_help_and_options_doc(run_moe, help_text, option):
    proc = run_moe([option, "no-such-value"], np_=1)
    assert proc.returncode != 0
    m = re.search(r"\(valid: ([^)]*)\)", proc.stdout + proc.stderr)
    assert m, f"{option}: no '(valid: ...)' in {proc.stdout + proc.stderr!r}"
    values = [v.strip() for v in m.group(1).split(",")]
    entry = help_entries(help_text)[option]
    row = doc_rows()[option]
    for v in values:
        assert re.search(rf"(?<![\w:-]){re.escape(v)}(?![\w:-])", entry), \
            f"--help's {option} entry does not name {v!r}: {entry!r}"
        assert f"`{v}`" in row, f"docs/options.md's {option} row does not name `{v}`: {row!r}"


def options_of(text):
    return [m for m in OPTION.findall(text)]


def test_the_resume_rules_of_help_are_those_of_the_docs(help_text):
    # --help's lists come from the option table's resume column; docs/checkpoints.md's "Options on
    # resume" must list the same options under the same rule.
    section = help_text.split("\nOn --resume", 1)[1].split("\n\n", 1)[0]
    rules = {}
    for part in re.split(r"\n  (?=\S)", section)[1:]:
        label, names = part.split(":", 1)
        rules[label.strip()] = set(options_of(names))
    docs = os.path.join(os.path.dirname(OPTIONS_DOC), "checkpoints.md")
    with open(docs, encoding="utf-8") as f:
        text = f.read().split("### Options on resume\n", 1)[1].split("\n\n", 1)[0]
    bullets = {m.group(1): set(options_of(m.group(2)))
               for m in re.finditer(r"- \*\*([^*]+)\*\*:(.*?)(?=\n- |\Z)", text, re.S)}
    assert rules["continued unless given again"] == bullets["Continued unless given again"]
    assert rules["this run's own"] == bullets["This run's own"]
    assert "--steps" in rules["continued unless given again"] and "--stats" in rules["this run's own"]
    # Every other option is the checkpoint's: neither list names --seed or --lr.
    assert not {"--seed", "--lr"} & (rules["continued unless given again"] | rules["this run's own"])


def test_help_is_grouped_by_topic_and_names_every_option_once(help_text):
    # One group per table of the config file, as Boost.Program_options' option groups print.
    config = help_text.split("\nActions:", 1)[0]
    titles = ["Run:", "Model [architecture]:", "Routing and balancing [routing]:", "Data [data]:",
              "Statistics and output [output]:", "Checkpoints [checkpoint]:",
              "Optimizer [optimizer]:", "Parallelism [parallel]:"]
    starts = [config.index("\n" + t + "\n") for t in titles]
    assert starts == sorted(starts)
    listed = re.findall(r"^  (--[a-z0-9-]+)", config, re.M)
    assert len(listed) == len(set(listed)) > 40
    # Each option sits in the group of its config-file table (a few checks).
    def group_of(option):
        at = config.index("\n  " + option + " ")
        return max((s, t) for s, t in zip(starts, titles) if s < at)[1]
    assert group_of("--expert-placement") == "Parallelism [parallel]:"
    assert group_of("--bias-update-rate") == "Routing and balancing [routing]:"
    assert group_of("--log-every") == "Statistics and output [output]:"
