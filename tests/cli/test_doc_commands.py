"""The commands in README.md and docs/*.md work as written on a 2-core machine: every `mpirun` or
`mpiexec` of more ranks than 2 on one host says `--oversubscribe` (else Open MPI refuses it with
"not enough slots"), names the binary as the build leaves it (`build/moe_rt`), and its moe_rt
options parse (each such command is run with `--print-config`, which resolves every option and
exits). Commands with placeholders (`<name>`, `...`) or files a reader makes first (`--config`,
`--resume`) are checked for the launcher only."""
import glob
import os
import re
import shlex
import subprocess

import pytest
from mpi_launch import run_env  # tests/mpi_launch.py, on the path by conftest.py

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
CORES = 2  # the smallest machine the docs are written for
LAUNCHERS = {"mpirun", "mpiexec"}
# Options of mpirun that take a value, so that the program is found after them.
LAUNCHER_VALUES = {"-np", "-n", "-c", "--map-by", "--bind-to", "--rank-by", "--mca", "-x",
                   "--hostfile", "--host", "-H", "--npernode", "-N"}
# Options naming a file the reader makes before running the command.
NEEDS_FILE = {"--config", "--resume", "--hash-table", "--expert-placement"}


def code_commands(path):
    """[(line number, command words)] of the shell commands in the fenced code blocks of `path`
    (backslash continuations joined, a `$ ` prompt and `# comments` dropped) and of its inline
    code that starts a launcher."""
    commands, block, start, pending = [], False, 0, ""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            block, pending = not block, ""
            continue
        if not block:  # inline code: `mpirun ...` in a sentence or a table
            for span in re.findall(r"`([^`]+)`", line):
                try:
                    words = shlex.split(span)
                except ValueError:
                    continue
                if any(os.path.basename(w) in LAUNCHERS for w in words[:4]):
                    commands.append((number, words))
            continue
        text = line.strip()
        if not pending:
            start = number
            if text.startswith("$ "):
                text = text[2:]
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        text = pending + text
        pending = ""
        try:
            words = shlex.split(text, comments=True)
        except ValueError:  # output or prose inside the block, not a command
            continue
        if words:
            commands.append((start, words))
    return commands


def launches(words):
    """(launcher options, program, program arguments) of a command that runs mpirun or mpiexec
    (after environment assignments or a wrapper such as scripts/netns_hosts.sh), else None."""
    at = next((i for i, w in enumerate(words) if os.path.basename(w) in LAUNCHERS), None)
    if at is None:
        return None
    i = at + 1
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in LAUNCHER_VALUES else 1
    if i >= len(words):
        return None
    return words[at + 1:i], words[i], words[i + 1:], words[:at]


def ranks(options):
    for flag in ("-np", "-n"):
        if flag in options:
            return int(options[options.index(flag) + 1])
    return None


def doc_launches():
    found = []
    for path in DOCS:
        for number, words in code_commands(path):
            launch = launches(words)
            if launch:
                found.append((f"{os.path.relpath(path, ROOT)}:{number}", launch))
    return found


LAUNCHES = doc_launches()


def test_the_docs_have_launch_commands():
    assert len(LAUNCHES) > 15, LAUNCHES


def test_more_ranks_than_cores_say_oversubscribe():
    bad = []
    for where, (options, program, _, before) in LAUNCHES:
        n = ranks(options)
        several_hosts = {"--hostfile", "--host", "-H"} & set(options) or any(
            w.endswith("netns_hosts.sh") for w in before)
        if n and n > CORES and "--oversubscribe" not in options and not several_hosts:
            bad.append(f"{where}: {' '.join(options)} {program}")
    assert not bad, "launch more ranks than 2 cores without --oversubscribe:\n" + "\n".join(bad)


def test_the_binary_is_named_as_the_build_leaves_it():
    bad = [f"{where}: {program}" for where, (_, program, _, _) in LAUNCHES
           if os.path.basename(program) == "moe_rt" and program != "build/moe_rt"
           and not program.startswith("$")]
    assert not bad, "moe_rt not named build/moe_rt:\n" + "\n".join(bad)


def runnable(arguments):
    text = " ".join(arguments)
    # An MPMD line (`A : B`) runs two programs: its halves are not one command line.
    return (not re.search(r"<|>|\.\.\.|…|\$", text) and not NEEDS_FILE & set(arguments)
            and ":" not in arguments)


@pytest.mark.parametrize("where,arguments", [
    (where, args) for where, (_, program, args, _) in LAUNCHES
    if program == "build/moe_rt" and runnable(args)])
def test_the_options_of_each_command_parse(moe_rt_bin, where, arguments):
    proc = subprocess.run([moe_rt_bin] + arguments + ["--print-config"], env=run_env(),
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, f"{where}: moe_rt {' '.join(arguments)}: {proc.stderr}"


def script_commands():
    """[(where, script path, its arguments)] of the commands that run one of the repository's
    scripts (`python3 scripts/x.py ...`, `scripts/x.sh ...`, `bench/...`)."""
    found = []
    for path in DOCS:
        for number, words in code_commands(path):
            words = [w for w in words if not re.match(r"^[A-Z_]+=", w)]  # VAR=value prefixes
            if words and (words[0].startswith("python") or words[0] in ("bash", "sbatch")):
                words = words[1:]
            if words and re.match(r"^(scripts|bench)/[\w/.-]+\.(py|sh|sbatch)$", words[0]):
                found.append((f"{os.path.relpath(path, ROOT)}:{number}", words[0], words[1:]))
    return found


@pytest.mark.parametrize("where,arguments", [
    (where, args) for where, script, args in script_commands()
    if script == "scripts/run.sh" and runnable(args)])
def test_the_options_given_to_run_sh_parse(moe_rt_bin, where, arguments):
    # scripts/run.sh runs moe_rt with them, after --model deepseek4-tiny unless they choose one.
    model = [] if {"--model", "--config"} & set(arguments) else ["--model", "deepseek4-tiny"]
    proc = subprocess.run([moe_rt_bin] + model + arguments + ["--print-config"], env=run_env(),
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, f"{where}: scripts/run.sh {' '.join(arguments)}: {proc.stderr}"


def test_the_scripts_named_exist_and_moe_stats_knows_the_subcommand():
    found = script_commands()
    assert len(found) > 10, found
    missing = [f"{where}: {script}" for where, script, _ in found
               if not os.path.isfile(os.path.join(ROOT, script))]
    assert not missing, "scripts named in the docs that do not exist:\n" + "\n".join(missing)
    usage = subprocess.run(["python3", os.path.join(ROOT, "scripts", "moe_stats.py"), "--help"],
                           capture_output=True, text=True, timeout=60).stdout
    known = set(re.search(r"\{([a-z,-]+)\}", usage).group(1).split(","))
    unknown = [f"{where}: {args[0] if args else '(none)'}" for where, script, args in found
               if script == "scripts/moe_stats.py" and (not args or args[0] not in known)
               and args[:1] != ["--help"]]
    assert not unknown, "moe_stats.py subcommands that do not exist:\n" + "\n".join(unknown)


def test_relative_links_and_images_resolve():
    """Every relative link and image of README.md and docs/*.md names a file that exists (the
    README's figures included); anchors and web addresses are not followed."""
    broken = []
    for path in DOCS:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            file = os.path.join(os.path.dirname(path), target.split("#", 1)[0])
            if not os.path.exists(file):
                broken.append(f"{os.path.relpath(path, ROOT)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)
