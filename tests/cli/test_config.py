"""The configuration across ranks and through config files: ranks given different options (an
MPMD command line, node-local config files) stop at set-up with one message naming the first
differing option, never a hang or a silent run; --print-config output reads back unchanged
through --config; config files are TOML (the old `key = value` files read once with a note);
errors quote a bounded excerpt of what the file holds."""
import tomllib

import h5py
import pytest

from test_bad_input import assert_one_clear_error, error_lines

MICRO = ["--model", "micro", "--steps", "2", "--stats", "none"]


@pytest.mark.parametrize("rank0,rank1,words", [
    # Different step counts used to hang in the collectives of the last step.
    (["--steps", "5"], ["--steps", "6"], ["--steps is '5' on rank 0 but '6' on rank 1"]),
    # A different seed or learning rate used to train on silently, with exit 0.
    (["--seed", "1"], ["--seed", "2"], ["--seed is '1' on rank 0 but '2' on rank 1"]),
    (["--lr", "0.01"], ["--lr", "0.02"], ["--lr is '0.01' on rank 0 but '0.02' on rank 1"]),
    (["--stats", "a#1.h5"], [], ["--stats is 'a#1.h5' on rank 0 but '' on rank 1"]),
    ([], ["--help"], ["--help is 'false' on rank 0 but 'true' on rank 1"]),
])
def test_ranks_with_different_options_stop(run_moe_mpmd, tmp_path, rank0, rank1, words):
    proc = run_moe_mpmd([["--model", "micro"] + rank0, ["--model", "micro"] + rank1],
                        timeout=60, cwd=tmp_path)
    assert_one_clear_error(proc, "ranks disagree on the configuration", *words)
    assert not list(tmp_path.iterdir())  # no statistics file started


def test_ranks_with_different_config_files_stop(run_moe_mpmd, tmp_path):
    # Node-local files of the same name hold different contents: here, two files.
    (tmp_path / "a.cfg").write_text("model = micro\nsteps = 2\nwarmup-steps = 1\n")
    (tmp_path / "b.cfg").write_text("model = micro\nsteps = 2\nwarmup-steps = 3\n")
    proc = run_moe_mpmd([["--config", str(tmp_path / "a.cfg"), "--stats", "none"],
                         ["--config", str(tmp_path / "b.cfg"), "--stats", "none"]], timeout=60)
    assert_one_clear_error(proc, "--warmup-steps is '1' on rank 0 but '3' on rank 1")


def test_ranks_may_differ_in_threads(run_moe_mpmd):
    # --threads changes no bit of the result, so ranks on different nodes may use different counts.
    proc = run_moe_mpmd([MICRO + ["--threads", "1"], MICRO + ["--threads", "2"]])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not error_lines(proc)
    assert "summary:" in proc.stdout


def test_print_config_reads_back_unchanged(run_moe, tmp_path):
    # Boost's parser cut a value at any '#': `stats = run#1.h5` read back as `run`.
    awkward = ["--stats", "run#1.h5", "--hash-table", ' a "quoted" \\path\\ # not a comment ',
               "--data", "text:é€ = #x"]
    first = run_moe(["--model", "micro"] + awkward + ["--print-config"])
    assert first.returncode == 0, first.stderr
    assert 'stats = "run#1.h5"\n' in first.stdout
    cfg = tmp_path / "printed.cfg"
    cfg.write_text(first.stdout)
    second = run_moe(["--config", str(cfg), "--print-config"])
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout


def test_huge_config_value_is_quoted_as_an_excerpt(run_moe, tmp_path):
    cfg = tmp_path / "huge.cfg"
    cfg.write_bytes(b"model = micro\nsteps = 2\nlayers = " + b"7" * 10_000_000 + b"\n")
    proc = run_moe(["--config", str(cfg)])
    assert_one_clear_error(proc, str(cfg), "line 3", "--layers", "(10000000 bytes)")
    assert len(error_lines(proc)[0]) < 400


def test_control_characters_in_a_config_file_are_escaped(run_moe, tmp_path):
    cfg = tmp_path / "binary.cfg"
    cfg.write_bytes(b"model = micro\nstats = a\x00b\x1b[31mred\n")
    proc = run_moe(["--config", str(cfg)])
    assert_one_clear_error(proc, str(cfg), "line 2", "\\x00", "\\x1B[31m")
    assert "\x1b" not in proc.stderr


def test_a_toml_config_runs_and_is_what_the_statistics_file_records(run_moe, tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('model = "micro"\nsteps = 3\n\n[optimizer]\nlr = 1e-2\ngrad-clip = 1\n\n'
                   '[output]\nstats = "s #1.h5"\n\n[parallel]\nranks-per-host = 1\n')
    proc = run_moe(["--config", str(cfg)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "note:" not in proc.stderr
    with h5py.File(tmp_path / "s #1.h5", "r") as f:
        text = f.attrs["config"]
        typed = dict(f["config"].attrs)
    # The file's configuration is TOML that tomllib reads, with the typed /config's values.
    doc = tomllib.loads(text)
    flat = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    for table in (v for v in doc.values() if isinstance(v, dict)):
        flat.update(table)
    assert flat.keys() == typed.keys()
    assert flat["lr"] == typed["lr"] == 0.01 and flat["steps"] == typed["steps"] == 3
    assert flat["grad-clip"] == 1.0 and flat["ranks-per-host"] == 1
    assert flat["stats"] == typed["stats"] == "s #1.h5"


def test_an_old_key_value_file_is_read_once_with_a_note(run_moe, tmp_path):
    old = tmp_path / "old.cfg"
    old.write_text("model = micro\nsteps = 2\nstats = none   # no file\nlr = 0.01\n")
    proc = run_moe(["--config", str(old), "--print-config"])
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("moe_rt: note:")]
    assert len(notes) == 1, proc.stderr  # rank 0 only
    assert f"'{old}' is in the old `key = value` format" in notes[0]
    assert f"moe_rt --config {old} --print-config > NEW.toml" in notes[0]
    # What it prints is the same configuration as TOML, and reads back without a note.
    new = tmp_path / "new.toml"
    new.write_text(proc.stdout)
    again = run_moe(["--config", str(new), "--print-config"])
    assert again.returncode == 0 and again.stdout == proc.stdout and "note:" not in again.stderr
    assert tomllib.loads(proc.stdout)["optimizer"]["lr"] == 0.01


@pytest.mark.parametrize("text,words", [
    ('model = "micro"\n[optimizer]\nsteps = 2\n', ["line 3", "'steps' belongs at the top level"]),
    ('model = "micro"\nsteps = "2"\n', ["line 2", "--steps takes an integer, got a TOML string"]),
    ('model = "micro"\n[output]\nstats = runs/a.h5\n',
     ["line 3", "invalid TOML", '(text is a quoted string: stats = "runs/a.h5")']),
])
def test_toml_errors_are_one_line_naming_the_line(run_moe, tmp_path, text, words):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    assert_one_clear_error(run_moe(["--config", str(cfg)]), str(cfg), *words)


def test_a_text_option_that_is_not_utf8_is_refused(run_moe, tmp_path):
    # TOML text is UTF-8: such a value could not be written to the configuration.
    proc = run_moe(MICRO[:-1] + [str(tmp_path / "s\udcff.h5")])
    assert_one_clear_error(proc, "--stats", "\\xFF.h5", "not valid UTF-8")
