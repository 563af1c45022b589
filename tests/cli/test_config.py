"""The configuration through config files: --print-config output reads back unchanged through
--config; errors quote a bounded excerpt of what the file holds."""
from test_bad_input import assert_one_clear_error, error_lines


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
