"""scripts/prepare_data.py: a small corpus (this repository's Markdown files) -> llm.c shards and a
BPE tokenizer. The shard header and size, token range, decoding back to the exact documents,
byte-identical reruns, one message and exit 2 for each bad input, the packaged default corpus
(a slice of it), and a short moe_rt run on the shard (needs MOE_RT_BIN, skipped without it)."""
import glob
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpi_launch import launcher, run_env  # noqa: E402  (tests/mpi_launch.py, shared)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "prepare_data.py")
VOCAB = 300          # small enough to train in well under a second, above the 257 minimum
SEQ_LEN = 16         # moe_rt's micro preset


def prepare(*args, cwd=None):
    return subprocess.run([sys.executable, SCRIPT] + [str(a) for a in args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def read_shard(path):
    """(header int32[256], tokens uint16[count]); asserts the file is exactly header + count."""
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    tokens = np.frombuffer(raw[1024:], dtype="<u2")
    assert len(raw) == 1024 + 2 * header[2], f"{path}: size {len(raw)}, header count {header[2]}"
    return header, tokens


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A folder of UTF-8 documents (README, docs/*.md: English with γ, —, ≥), one binary file
    and one hidden file that must be skipped; returns (folder, {name: text} of the documents)."""
    folder = tmp_path_factory.mktemp("corpus")
    texts = {}
    docs = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    sources = [os.path.join(ROOT, "README.md")] + docs
    for src in sources:
        name = os.path.basename(src)
        shutil.copy(src, folder / name)
        texts[name] = open(src, encoding="utf-8").read()
    (folder / "sub").mkdir()
    (folder / "sub" / "special.txt").write_text("A literal <|endoftext|> is text, not a token.\n")
    texts["special.txt"] = "A literal <|endoftext|> is text, not a token.\n"
    (folder / "image.bin").write_bytes(bytes([0xff, 0xfe, 0x00, 0x81]) * 100)
    (folder / ".hidden").write_text("never read\n")
    return folder, texts


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared") / "shards"
    proc = prepare("--input", corpus[0], "--out", out, "--vocab", VOCAB, "--seq-len", SEQ_LEN,
                   "--val-fraction", 0.2)
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def test_shards_have_the_llm_c_header_and_tokens_below_vocab(prepared):
    out, _ = prepared
    for name in ("train.bin", "val.bin"):
        header, tokens = read_shard(out / name)
        assert list(header[:2]) == [20240520, 1]
        assert not header[3:].any()
        assert header[2] > SEQ_LEN + 1
        assert tokens.max() < VOCAB
        assert tokens[0] == 0   # every document starts with <|endoftext|>


def test_tokenizer_decodes_the_shards_back_to_the_documents(prepared, corpus):
    out, _ = prepared
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tokenizer.get_vocab_size() <= VOCAB
    assert tokenizer.token_to_id("<|endoftext|>") == 0
    decoded = []
    for name in ("train.bin", "val.bin"):
        tokens = read_shard(out / name)[1].tolist()
        starts = [i for i, t in enumerate(tokens) if t == 0] + [len(tokens)]
        decoded += [tokenizer.decode(tokens[a + 1:b]) for a, b in zip(starts, starts[1:])]
    assert sorted(decoded) == sorted(corpus[1].values())   # binary and hidden files skipped


def test_summary_names_counts_and_the_command(prepared, corpus):
    out, stdout = prepared
    num_docs = len(corpus[1])
    assert f"documents   {num_docs} (" in stdout
    assert "1 files skipped as not UTF-8" in stdout
    num_train = read_shard(out / "train.bin")[0][2]
    assert f"train.bin: {num_train} tokens" in stdout
    assert f"--vocab {VOCAB} --seq-len {SEQ_LEN} --data tokens:{out / 'train.bin'}" in stdout
    assert "bytes/token" in stdout


def test_same_inputs_give_byte_identical_files(prepared, corpus, tmp_path):
    out, _ = prepared
    again = tmp_path / "again"
    args = ["--input", corpus[0], "--vocab", VOCAB, "--seq-len", SEQ_LEN, "--val-fraction", 0.2]
    assert prepare(*args, "--out", again).returncode == 0
    assert prepare(*args, "--out", again, "--overwrite").returncode == 0   # over its own output
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (again / name).read_bytes() == (out / name).read_bytes(), name
    other = tmp_path / "other-seed"
    assert prepare(*args, "--out", other, "--seed", 7).returncode == 0
    assert (other / "val.bin").read_bytes() != (out / "val.bin").read_bytes()


def test_one_document_is_split_near_its_end(corpus, tmp_path):
    text = corpus[1]["load-balancing.md"]
    path = tmp_path / "one.md"
    path.write_text(text, encoding="utf-8")
    proc = prepare("--input", path, "--out", tmp_path / "out", "--vocab", VOCAB,
                   "--seq-len", SEQ_LEN, "--val-fraction", 0.1)
    assert proc.returncode == 0, proc.stderr
    tokenizer = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    train = tokenizer.decode(read_shard(tmp_path / "out" / "train.bin")[1][1:].tolist())
    val = tokenizer.decode(read_shard(tmp_path / "out" / "val.bin")[1][1:].tolist())
    assert train + val == text
    assert train.endswith("\n\n")   # cut at a paragraph boundary
    assert 0.05 < len(val) / len(text) < 0.15


@pytest.fixture
def bad_inputs(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "nothing.txt").write_text("")
    (tmp_path / "tiny.txt").write_text("Hello, world.\n\nGoodbye.\n")
    (tmp_path / "exists").mkdir()
    return tmp_path


@pytest.mark.parametrize("args, message", [
    (["--input", "{d}/missing"], "input '{d}/missing' does not exist"),
    (["--input", "{d}/empty"], "empty corpus: no UTF-8 text in '{d}/empty'"),
    (["--input", "{d}/tiny.txt", "--vocab", "256"], "--vocab 256 out of range"),
    (["--input", "{d}/tiny.txt", "--vocab", "65537"], "--vocab 65537 out of range"),
    (["--input", "{d}/tiny.txt", "--out", "{d}/exists"],
     "output folder '{d}/exists' exists: pass --overwrite"),
    (["--input", "{d}/tiny.txt", "--val-fraction", "1"], "--val-fraction 1.0 must lie strictly"),
    (["--input", "{d}/tiny.txt"], "corpus too small: the train shard would hold"),
])
def test_bad_input_exits_2_with_one_message(bad_inputs, args, message):
    d = str(bad_inputs)
    args = [a.format(d=d) for a in args]
    if "--out" not in args:
        args += ["--out", os.path.join(d, "out")]
    proc = prepare(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == lines[-1].strip() and message.format(d=d) in lines[-1], proc.stderr
    assert lines[-1].startswith("prepare_data.py: error: ")
    assert not os.path.exists(os.path.join(d, "out")), "nothing written on bad input"


def test_default_corpus_slice(tmp_path):
    """The packaged corpus (Debian's python3-doc, installed by scripts/setup.sh), its first
    300 kB: a missing package fails here rather than in a user's first run."""
    proc = prepare("--out", tmp_path / "docs", "--max-bytes", 300000)
    assert proc.returncode == 0, proc.stderr
    assert "python3-doc" in proc.stdout
    header, tokens = read_shard(tmp_path / "docs" / "train.bin")
    assert header[2] > 50000 and tokens.max() < 2048
    bytes_per_token = float(proc.stdout.split("bytes/token")[1].split()[0])
    assert 2.0 < bytes_per_token < 5.0   # BPE at V = 2048 on English prose


def test_moe_rt_trains_on_the_shard(prepared):
    binary = os.environ.get("MOE_RT_BIN")
    if not binary:
        pytest.skip("MOE_RT_BIN is not set: point it at the built moe_rt to train on the shard")
    out, _ = prepared
    command = launcher(2) + [binary, "--model", "micro", "--vocab", str(VOCAB), "--steps", "3",
                             "--data", f"tokens:{out / 'train.bin'}", "--val-data",
                             f"tokens:{out / 'val.bin'}", "--eval-batches", "1", "--stats", "none"]
    proc = subprocess.run(command, env=run_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"tokens:{out / 'train.bin'}" in proc.stdout
    steps = [line.split() for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [int(s[0]) for s in steps[:3]] == [0, 1, 2]
    assert all(np.isfinite(float(s[1])) for s in steps[:3])
    # ... max_viol eta val_loss val_viol: the validation after the last step
    assert len(steps[2]) == 11 and np.isfinite(float(steps[2][9]))
    assert "validation loss" in proc.stdout


# --------------------------------------------------------------------------------------------
# Output that cannot be written: one line, exit 2, no .tmp file left behind.


def assert_refused(proc, message):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("prepare_data.py: error: ") and message in last, proc.stderr


def leftovers(folder):
    return sorted(str(p) for p in folder.rglob("*.tmp")) if folder.exists() else []


@pytest.fixture
def tmpfs(tmp_path):
    """mount(tmpfs) at tmp_path/mnt with the given options; unmounted after the test. Skipped
    (saying why) where this process may not mount."""
    mounted = []

    def mount(options):
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}): the injected "
                        f"failures below cover the same paths")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


def test_an_output_under_a_file_is_refused(corpus, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = prepare("--input", corpus[0], "--out", blocker / "shards", "--vocab", VOCAB,
                   "--seq-len", SEQ_LEN)
    assert_refused(proc, f"output '{blocker / 'shards'}': '{blocker}' is not a folder")
    assert blocker.read_text() == "not a folder"


def test_an_output_that_is_a_file_is_refused(corpus, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = prepare("--input", corpus[0], "--out", blocker, "--vocab", VOCAB)
    assert_refused(proc, f"output '{blocker}' exists and is not a folder")   # not "--overwrite"


def test_a_read_only_output_is_refused(corpus, tmpfs):
    folder = tmpfs("ro,size=64k")
    proc = prepare("--input", corpus[0], "--out", folder / "shards", "--vocab", VOCAB,
                   "--seq-len", SEQ_LEN)
    assert_refused(proc, f"'{folder}' is on a read-only file system")


def test_a_full_output_is_refused_and_leaves_no_tmp_file(corpus, tmpfs):
    folder = tmpfs("size=64k")             # the shards of the corpus need about 200 kB
    out = folder / "shards"
    proc = prepare("--input", corpus[0], "--out", out, "--vocab", VOCAB, "--seq-len", SEQ_LEN)
    assert_refused(proc, "No space left on device")
    assert leftovers(folder) == [] and sorted(os.listdir(out)) == []


@pytest.fixture
def prepare_module(monkeypatch):
    scripts = os.path.join(ROOT, "scripts")
    monkeypatch.syspath_prepend(scripts)
    import prepare_data
    return prepare_data


@pytest.mark.parametrize("failing", ["train.bin.tmp", "val.bin.tmp"])
def test_an_injected_full_disk_leaves_no_tmp_file_and_no_mix(prepare_module, corpus, tmp_path,
                                                             monkeypatch, capsys, failing):
    # The same failure as the tmpfs test, where mount is not allowed: the write of one shard
    # fails with ENOSPC. An --overwrite of an earlier output keeps all of the earlier files.
    out = tmp_path / "shards"
    args = ["--input", str(corpus[0]), "--out", str(out), "--vocab", str(VOCAB),
            "--seq-len", str(SEQ_LEN)]
    assert prepare_module.main(args) == 0
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    real_open = open

    class FullFile:
        def __init__(self, path):
            self.file = real_open(path, "wb")

        def write(self, data):
            raise OSError(28, "No space left on device", str(self.file.name))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    def full_open(path, mode="r", *rest, **kwargs):
        if os.path.basename(str(path)) == failing:
            return FullFile(path)
        return real_open(path, mode, *rest, **kwargs)

    monkeypatch.setattr(prepare_module, "open", full_open, raising=False)
    capsys.readouterr()
    assert prepare_module.main(args + ["--overwrite", "--seed", "7"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (f"prepare_data.py: error: cannot write '{out / failing[:-4]}': No space "
                       f"left on device")
    assert leftovers(out) == []
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before


# --------------------------------------------------------------------------------------------
# A small corpus: the printed command is one moe_rt runs.


def printed_command(stdout):
    line = [line for line in stdout.splitlines() if line.startswith("train with  ")][0]
    return shlex.split(line[len("train with  "):])


def run_printed(command, binary):
    """The printed command on this machine: mpirun -np 8 through the test launcher, one step."""
    assert command[:3] == ["mpirun", "-np", "8"]
    run = launcher(8) + [binary] + command[4:] + ["--steps", "1", "--stats", "none"]
    return subprocess.run(run, env=run_env(), capture_output=True, text=True, timeout=300)


@pytest.fixture
def paragraphs(tmp_path):
    """A one-document corpus of distinct sentences, as many as asked."""
    def write(count):
        path = tmp_path / f"corpus{count}.txt"
        path.write_text("".join(f"Paragraph {i} says that {i * 7 % 13} experts took token "
                                f"{i * 31 % 97}.\n\n" for i in range(count)))
        return path
    return write


def test_a_validation_shard_too_short_for_one_evaluation_is_left_out(paragraphs, tmp_path):
    out = tmp_path / "out"
    proc = prepare("--input", paragraphs(30), "--out", out, "--vocab", VOCAB, "--seq-len",
                   SEQ_LEN)
    assert proc.returncode == 0, proc.stderr
    num_val = read_shard(out / "val.bin")[0][2]
    assert num_val < 8 * SEQ_LEN + 1
    command = printed_command(proc.stdout)
    assert "--val-data" not in command and command[6:10] == ["--vocab", str(VOCAB), "--seq-len",
                                                           str(SEQ_LEN)]
    assert (f"prepare_data.py: warning: the validation shard's {num_val} tokens are too few for "
            f"one evaluation on 8 ranks ({8 * SEQ_LEN + 1} tokens)") in proc.stderr
    binary = os.environ.get("MOE_RT_BIN")
    if binary:
        run = run_printed(command, binary)
        assert run.returncode == 0, run.stdout + run.stderr


def test_a_small_validation_shard_gets_fewer_eval_batches(paragraphs, tmp_path):
    out = tmp_path / "out"
    proc = prepare("--input", paragraphs(400), "--out", out, "--vocab", VOCAB, "--seq-len",
                   SEQ_LEN, "--val-fraction", 0.05)
    assert proc.returncode == 0, proc.stderr
    num_val = read_shard(out / "val.bin")[0][2]
    batches = (num_val - 1) // (8 * SEQ_LEN)
    assert 1 <= batches < 4, num_val            # the corpus is sized for this case
    command = printed_command(proc.stdout)
    assert command[-2:] == ["--eval-batches", str(batches)] and "--val-data" in command
    binary = os.environ.get("MOE_RT_BIN")
    if not binary:
        pytest.skip("MOE_RT_BIN is not set: the printed command was checked, not run")
    run = run_printed(command, binary)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "validation loss" in run.stdout
