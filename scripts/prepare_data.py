#!/usr/bin/env python3
"""Real text for moe_rt: a text corpus -> a byte-level BPE tokenizer trained on it and two llm.c
token shards, train.bin and val.bin, that `moe_rt --data tokens:PATH` reads.

    python3 scripts/prepare_data.py                      # the packaged corpus -> data/python-docs
    python3 scripts/prepare_data.py --input books/ --out data/books --vocab 4096

The corpus is a text file or a folder of them (every regular UTF-8 file under it, hidden ones
skipped, in path order). By default it is the Python 3 documentation's reStructuredText sources
(`_sources/**/*.rst.txt`, about 11 MB of English in 497 files), installed offline by Debian's
`python3-doc` package (scripts/setup.sh installs it) and licensed under the PSF License
Agreement (the code examples in it also under the Zero-Clause BSD licence).

Split: documents are shuffled with --seed and the first ones, until they hold --val-fraction of
the corpus bytes, form the validation shard; the rest, in the shuffled order, the train shard. A
corpus of one document is split at the paragraph (else line) boundary nearest that fraction from
its end, the tail for validation. Every document is preceded by <|endoftext|> (id 0), as in
llm.c's shards. The tokenizer (Hugging Face `tokenizers`: byte-level BPE, no normaliser, so
decoding gives back the exact text) is trained on the train documents only, up to --vocab ids.

Shard format (io/token_data.hpp): 256 little-endian int32 (magic 20240520, version 1, token
count, zeros), then the tokens as little-endian uint16. The same inputs and options give
byte-identical shards and tokenizer.json. Bad input ends with one line naming the problem and
exit status 2; so does an output that cannot be written (--out under a file, a read-only or full
file system): the three files are written as NAME.tmp and renamed together, and a failure
removes the .tmp files and leaves any earlier output as it was.

The moe_rt command printed at the end is one moe_rt accepts for these shards (8 ranks of
deepseek4-tiny, the --vocab and --seq-len given): a validation shard too short for moe_rt's 4
evaluation batches gets the --eval-batches that fit, and one too short for a single batch is left
out of the command, with a warning on stderr.
"""
import argparse
import os
import random
import shlex
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CORPUS = "/usr/share/doc/python3/html/_sources"
DEFAULT_CORPUS_NAME = ("Debian python3-doc: the Python 3 documentation sources, "
                       "PSF License Agreement")
EOT = "<|endoftext|>"
SHARD_MAGIC, SHARD_VERSION, SHARD_HEADER_INTS = 20240520, 1, 256
MIN_VOCAB = 257          # the 256 byte tokens and <|endoftext|>
MAX_VOCAB = 1 << 16      # ids must fit uint16
PRESET_VOCAB, PRESET_SEQ_LEN = 2048, 256   # deepseek4-tiny's V and S
PRESET_BATCH_PER_RANK, PRESET_EVAL_BATCHES = 1, 4   # its B, and moe_rt's default --eval-batches
SUGGESTED_RANKS = 8      # the printed command's mpirun -np


class InputError(Exception):
    """Bad input: reported as one line, exit status 2."""


class Progress:
    """A one-line bar on stderr when it is a terminal; otherwise one line at each quarter."""

    def __init__(self, label, total, stream=sys.stderr):
        self.label, self.total, self.stream = label, max(total, 1), stream
        self.tty = stream.isatty()
        self.shown = 0

    def update(self, done):
        percent = 100 * done // self.total
        if self.tty:
            if percent != self.shown:
                bar = "#" * (percent // 4)
                self.stream.write(f"\r{self.label:<10} [{bar:<25}] {percent:3d}% "
                                  f"({done}/{self.total})")
                self.stream.flush()
        elif percent // 25 != self.shown // 25 and percent % 100:
            self.stream.write(f"{self.label}: {percent}% ({done}/{self.total})\n")
        self.shown = percent

    def close(self):
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def read_corpus(path, max_bytes):
    """[(name, text)] in path order, at most max_bytes UTF-8 bytes (0: no limit), and the number
    of files skipped as not UTF-8 text."""
    if not os.path.exists(path):
        raise InputError(f"input '{path}' does not exist")
    if os.path.isdir(path):
        files = []
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files += [os.path.join(folder, n) for n in sorted(names) if not n.startswith(".")]
        files = sorted(f for f in files if os.path.isfile(f))
    elif os.path.isfile(path):
        files = [path]
    else:
        raise InputError(f"input '{path}' is neither a file nor a folder")
    docs, skipped, budget = [], 0, max_bytes or float("inf")
    progress = Progress("reading", len(files))
    for idx, name in enumerate(files):
        with open(name, "rb") as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            if len(files) == 1:
                raise InputError(f"input '{name}' is not UTF-8 text") from None
            skipped += 1
            continue
        if len(raw) > budget:   # cut at a character boundary
            text = raw[:int(budget)].decode("utf-8", errors="ignore")
        if text:
            docs.append((os.path.relpath(name, path) if name != path else name, text))
            budget -= len(text.encode("utf-8"))
        progress.update(idx + 1)
        if budget <= 0:
            break
    progress.close()
    if not docs:
        raise InputError(f"empty corpus: no UTF-8 text in '{path}'"
                         + (f" ({skipped} files skipped as not UTF-8)" if skipped else ""))
    return docs, skipped


def split_corpus(docs, val_fraction, seed):
    """(train texts, val texts): whole documents, shuffled by seed; one document is cut at a
    paragraph or line boundary near its end."""
    if len(docs) == 1:
        text = docs[0][1]
        target = int(len(text) * (1 - val_fraction))
        cut = -1
        for sep in ("\n\n", "\n"):
            before, after = text.rfind(sep, 0, target + 1), text.find(sep, target)
            candidates = [c + len(sep) for c in (before, after)
                          if 0 <= c and c + len(sep) < len(text)]
            if candidates:
                cut = min(candidates, key=lambda c: abs(c - target))
                break
        cut = cut if cut > 0 else target
        if cut <= 0 or cut >= len(text):
            raise InputError(f"corpus too small for the split: one document of {len(text)} "
                             f"characters cannot give --val-fraction {val_fraction}")
        return [text[:cut]], [text[cut:]]
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    sizes = [len(docs[i][1].encode("utf-8")) for i in order]
    want, num_val, val_bytes = val_fraction * sum(sizes), 0, 0
    while val_bytes < want:
        val_bytes += sizes[num_val]
        num_val += 1
    if num_val == len(docs):
        raise InputError(f"corpus too small for the split: --val-fraction {val_fraction} of "
                         f"{len(docs)} documents leaves none for training")
    return [docs[i][1] for i in order[num_val:]], [docs[i][1] for i in order[:num_val]]


def train_tokenizer(texts, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=sys.stderr.isatty())
    if not sys.stderr.isatty():
        print(f"training the tokenizer on {len(texts)} documents", file=sys.stderr)
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    tokenizer.encode_special_tokens = True   # "<|endoftext|>" inside a text is plain text
    return tokenizer


def encode(tokenizer, texts, label):
    """The uint16 tokens of the texts, each preceded by <|endoftext|>."""
    eot, parts, batch = tokenizer.token_to_id(EOT), [], 64
    progress = Progress(label, len(texts))
    for start in range(0, len(texts), batch):
        encodings = tokenizer.encode_batch(texts[start:start + batch], add_special_tokens=False)
        for encoding in encodings:
            parts.append(np.array([eot] + encoding.ids, dtype="<u2"))
        progress.update(min(start + batch, len(texts)))
    progress.close()
    return np.concatenate(parts)


def write_shard(path, tokens):
    """The shard at `path` (the caller renames it into place)."""
    header = np.zeros(SHARD_HEADER_INTS, dtype="<i4")
    header[:3] = SHARD_MAGIC, SHARD_VERSION, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def write_outputs(out, train, val, tokenizer):
    """train.bin, val.bin and tokenizer.json in `out`: each written to NAME.tmp, then all three
    renamed into place, so that a failure (read-only or full file system, --out under a file)
    leaves neither a .tmp file nor a mix of old and new files. Returns {name: path}."""
    for name, tokens in (("train", train), ("validation", val)):
        if len(tokens) >= 1 << 31:
            raise InputError(f"the {name} shard's {len(tokens)} tokens do not fit one shard's "
                             f"int32 count: use --max-bytes")
    paths = {n: os.path.join(out, n) for n in ("train.bin", "val.bin", "tokenizer.json")}
    written = []
    try:
        try:
            os.makedirs(out, exist_ok=True)
        except OSError as err:
            raise InputError(f"cannot make the output folder '{out}': "
                             f"{err.strerror or err}") from None
        for name, tokens in (("train.bin", train), ("val.bin", val)):
            written.append(paths[name] + ".tmp")
            write_shard(written[-1], tokens)
        written.append(paths["tokenizer.json"] + ".tmp")
        tokenizer.save(written[-1], pretty=True)
        for tmp in written:
            os.replace(tmp, tmp[:-len(".tmp")])
    except OSError as err:
        raise InputError(f"cannot write '{written[-1][:-len('.tmp')]}': "
                         f"{err.strerror or err}") from None
    except Exception as err:      # tokenizers reports a failed save as an Exception of its own
        if not written:
            raise
        raise InputError(f"cannot write '{written[-1][:-len('.tmp')]}': {err}") from None
    finally:
        for tmp in written:
            if os.path.exists(tmp):
                os.remove(tmp)
    return paths


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Text corpus -> BPE tokenizer (Hugging Face tokenizers) and llm.c token "
                    "shards train.bin / val.bin for moe_rt --data tokens:PATH.",
        epilog=f"Default corpus: {DEFAULT_CORPUS}, from Debian's python3-doc package (the Python "
               "3 documentation sources, about 11 MB of English; PSF License Agreement, code "
               "examples also Zero-Clause BSD), installed by scripts/setup.sh: no download.")
    p.add_argument("--input", metavar="PATH",
                   help="a text file or a folder of them (default: the packaged corpus)")
    p.add_argument("--out", metavar="DIR",
                   help="output folder (default: data/python-docs, or data/<input name>)")
    p.add_argument("--vocab", type=int, metavar="N", default=PRESET_VOCAB,
                   help=f"tokenizer vocabulary, {MIN_VOCAB}..{MAX_VOCAB} (default {PRESET_VOCAB}, "
                        "deepseek4-tiny's --vocab)")
    p.add_argument("--val-fraction", type=float, metavar="X", default=0.05,
                   help="share of the corpus bytes for the validation shard (default 0.05)")
    p.add_argument("--seed", type=int, metavar="N", default=1234,
                   help="seed of the document shuffle (default 1234)")
    p.add_argument("--seq-len", type=int, metavar="N", default=PRESET_SEQ_LEN,
                   help="each shard must hold one sample of this many tokens + 1 (default 256)")
    p.add_argument("--max-bytes", type=int, metavar="N", default=0,
                   help="use only the first N bytes of the corpus, in path order (default 0: all)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the shards in an existing --out")
    args = p.parse_args(argv)
    if not MIN_VOCAB <= args.vocab <= MAX_VOCAB:
        raise InputError(f"--vocab {args.vocab} out of range: {MIN_VOCAB} (256 bytes and "
                         f"{EOT}) to {MAX_VOCAB} (uint16 token ids)")
    if not 0 < args.val_fraction < 1:
        raise InputError(f"--val-fraction {args.val_fraction} must lie strictly between 0 and 1")
    if args.seq_len < 1 or args.max_bytes < 0:
        raise InputError("--seq-len must be positive and --max-bytes not negative")
    if args.input is None and not os.path.isdir(DEFAULT_CORPUS):
        raise InputError(f"default corpus {DEFAULT_CORPUS} not found: install Debian's "
                         "python3-doc (scripts/setup.sh does) or pass --input")
    if args.out is None:
        name = "python-docs" if args.input is None else \
            os.path.splitext(os.path.basename(os.path.normpath(args.input)))[0]
        args.out = os.path.join("data", name)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise InputError(f"output '{args.out}' exists and is not a folder")
    if os.path.exists(args.out) and not args.overwrite:
        raise InputError(f"output folder '{args.out}' exists: "
                         "pass --overwrite to replace its shards")
    check_output_folder(args.out)
    return args


def check_output_folder(out):
    """Refuses, before the corpus is read, an --out that cannot be made: one under a file, or
    under a folder this process cannot write (a read-only file system included)."""
    parent = os.path.abspath(out)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise InputError(f"output '{out}': '{parent}' is not a folder")
    target = os.path.abspath(out) if os.path.isdir(out) else parent
    try:
        read_only = bool(os.statvfs(target).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False         # no statvfs here: the write itself reports the problem
    if read_only:
        raise InputError(f"output '{out}': '{target}' is on a read-only file system")
    if not os.access(target, os.W_OK | os.X_OK):
        raise InputError(f"output '{out}': cannot write in '{target}'")


def main(argv=None):
    try:
        args = parse_args(argv)
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            raise InputError("the Python package 'tokenizers' is missing: run scripts/setup.sh")
        docs, skipped = read_corpus(args.input or DEFAULT_CORPUS, args.max_bytes)
        train_texts, val_texts = split_corpus(docs, args.val_fraction, args.seed)
        tokenizer = train_tokenizer(train_texts, args.vocab)
        train, val = encode(tokenizer, train_texts, "train"), encode(tokenizer, val_texts, "val")
        for name, tokens in (("train", train), ("validation", val)):
            if len(tokens) < args.seq_len + 1:
                raise InputError(f"corpus too small: the {name} shard would hold {len(tokens)} "
                                 f"tokens, a sample of --seq-len {args.seq_len} needs "
                                 f"{args.seq_len + 1}")
        paths = write_outputs(args.out, train, val, tokenizer)
    except InputError as e:
        print(f"prepare_data.py: error: {e}", file=sys.stderr)
        return 2
    corpus_bytes = sum(len(t.encode("utf-8")) for t in train_texts + val_texts)
    num_eot = len(train_texts) + len(val_texts)   # one <|endoftext|> per document, no text
    bytes_per_token = corpus_bytes / (len(train) + len(val) - num_eot)
    command, note = train_command(args, paths, len(val))
    print(f"corpus      {args.input or DEFAULT_CORPUS + ' (' + DEFAULT_CORPUS_NAME + ')'}")
    print(f"documents   {len(docs)} ({len(train_texts)} train, {len(val_texts)} validation)"
          + (f", {skipped} files skipped as not UTF-8" if skipped else "")
          + f", {corpus_bytes} bytes")
    print(f"tokenizer   {paths['tokenizer.json']}: byte-level BPE, "
          f"{tokenizer.get_vocab_size()} tokens (--vocab {args.vocab})")
    print(f"train       {paths['train.bin']}: {len(train)} tokens")
    print(f"validation  {paths['val.bin']}: {len(val)} tokens")
    print(f"bytes/token {bytes_per_token:.3f}")
    print(f"train with  {shlex.join(command)}")
    if note:
        print(f"prepare_data.py: warning: {note}", file=sys.stderr)
    return 0


def eval_batches_that_fit(num_val_tokens, seq_len):
    """moe_rt's --eval-batches for the validation shard, at most its default: every evaluation
    reads --eval-batches x ranks x batch-per-rank sequences of S tokens, and the last target,
    without wrapping around (runtime/run/run_setup.cpp refuses a shorter file). 0: not one batch fits."""
    per_batch = SUGGESTED_RANKS * PRESET_BATCH_PER_RANK * seq_len
    return min(PRESET_EVAL_BATCHES, (num_val_tokens - 1) // per_batch)


def train_command(args, paths, num_val_tokens):
    """The moe_rt command printed at the end, one moe_rt accepts for these shards, and a note
    (None, or what the command leaves out and why)."""
    binary = os.path.relpath(os.path.join(ROOT, "build", "moe_rt"))
    command = ["mpirun", "-np", str(SUGGESTED_RANKS), binary, "--model", "deepseek4-tiny"]
    if args.vocab != PRESET_VOCAB:
        command += ["--vocab", str(args.vocab)]
    if args.seq_len != PRESET_SEQ_LEN:
        command += ["--seq-len", str(args.seq_len)]
    command += ["--data", "tokens:" + paths["train.bin"]]
    batches = eval_batches_that_fit(num_val_tokens, args.seq_len)
    if batches == 0:
        needed = SUGGESTED_RANKS * PRESET_BATCH_PER_RANK * args.seq_len + 1
        return command, (f"the validation shard's {num_val_tokens} tokens are too few for one "
                         f"evaluation on {SUGGESTED_RANKS} ranks ({needed} tokens), so the "
                         f"command trains without --val-data; give more text or a larger "
                         f"--val-fraction to evaluate")
    command += ["--val-data", "tokens:" + paths["val.bin"], "--eval-every", "50"]
    if batches < PRESET_EVAL_BATCHES:
        command += ["--eval-batches", str(batches)]
    return command, None


if __name__ == "__main__":
    sys.exit(main())
