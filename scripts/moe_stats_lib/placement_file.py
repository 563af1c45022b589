"""Expert placement files: which EP rank holds which experts, layer by layer, the file that
`moe_rt --expert-placement FILE` reads and `moe_stats.py placement --write` writes. The Placement
value, its checks, the reader and the writer.

The format (moe_rt's own parser, runtime/run/placement_file.cpp, reads exactly this):

    # comments run from '#' to the end of the line, anywhere; blank lines are ignored
    moe_rt-placement 1
    experts 8
    layers 7
    ranks 2
    layer 0: 0 1 2 3 | 4 5 6 7
    layer 1: 0 2 4 6 | 1 3 5 7 2
    ...

- The first line that is not blank or a comment is the header, the words `moe_rt-placement 1`.
- `experts E`, `layers L` and `ranks P` once each, in any order, before the first `layer` line;
  positive decimal counts.
- One `layer l:` line for each l in [0, L), in any order. After the colon, P groups separated by
  '|': group q lists the global expert ids EP rank q holds (decimal, whitespace-separated, any
  order; moe_rt orders a rank's experts by id).
- Every rank holds at least one expert, every id is in [0, E), every expert of [0, E) is on at
  least one rank of every layer, and no rank lists an expert twice. An expert on several ranks is
  replicated: moe_rt gives each replica the rows of a contiguous chunk of the EP group's
  sequences.

Errors are StatsError, one line naming the file, the line number where there is one, and the
problem: `placement.txt line 9: layer 1, rank 0: expert 9 outside [0, 8)`.

Shapes: L layers, P EP ranks, E experts.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .stats_file import StatsError

HEADER = ("moe_rt-placement", "1")
SIZE_KEYS = ("experts", "layers", "ranks")
# moe_rt reads counts and ids as int (from_chars): plain ASCII decimal digits, below 2^31.
COUNT = re.compile(r"[0-9]+")
COUNT_LIMIT = 2 ** 31
BLANKS = " \t\r"     # moe_rt splits words at these only (a form feed is part of a word)


def words_of(text):
    return [word for word in re.split(f"[{BLANKS}]+", text) if word]


@dataclass(frozen=True)
class Placement:
    """A placement of E experts on P EP ranks in each of L layers. layers[l][q] is the tuple of
    expert ids rank q holds in layer l, ascending (the order moe_rt gives a rank's experts)."""

    num_experts: int    # E
    num_ranks: int      # P
    layers: tuple       # [L][P] tuples of expert ids

    @property
    def num_layers(self):
        return len(self.layers)

    def replicas(self):
        """[L, E] int64: how many ranks hold each expert (1 = not replicated)."""
        counts = np.zeros((self.num_layers, self.num_experts), dtype=np.int64)
        for l, ranks in enumerate(self.layers):
            for experts in ranks:
                counts[l, list(experts)] += 1
        return counts

    def shares(self):
        """[L, P, E] float64: the share of expert e's rows rank q computes in layer l: 1 /
        replicas where q holds e, else 0. A rank's load is its row of shares times the loads."""
        counts = self.replicas()
        out = np.zeros((self.num_layers, self.num_ranks, self.num_experts))
        for l, ranks in enumerate(self.layers):
            for q, experts in enumerate(ranks):
                out[l, q, list(experts)] = 1.0 / counts[l, list(experts)]
        return out

    def instances(self, layer):
        """The set of (rank, expert) pairs of one layer: what a rank must hold."""
        return {(q, e) for q, experts in enumerate(self.layers[layer]) for e in experts}


def layer_problem(num_experts, ranks):
    """The first problem of one layer's [P] lists of expert ids, as moe_rt words it, or None."""
    for q, experts in enumerate(ranks):
        if not experts:
            return f"rank {q} holds no expert"
        seen = set()
        for e in experts:
            if not 0 <= e < num_experts:
                return f"rank {q}: expert {e} outside [0, {num_experts})"
            if e in seen:
                return f"rank {q} lists expert {e} twice"
            seen.add(e)
    placed = set().union(*(set(experts) for experts in ranks))
    missing = [e for e in range(num_experts) if e not in placed]
    if missing:
        return f"expert {missing[0]} is on no rank"
    return None


def make_placement(num_experts, layers, what="placement"):
    """Placement from [L][P] lists of expert ids, checked; StatsError naming `what` otherwise (a
    policy's output is checked the same way a file is)."""
    ranks_per_layer = {len(ranks) for ranks in layers}
    if len(ranks_per_layer) != 1 or not layers:
        raise StatsError(f"{what}: every layer must list the same number of ranks")
    for l, ranks in enumerate(layers):
        problem = layer_problem(num_experts, ranks)
        if problem:
            raise StatsError(f"{what}: layer {l}: {problem}")
    return Placement(num_experts, ranks_per_layer.pop(),
                     tuple(tuple(tuple(sorted(int(e) for e in experts)) for experts in ranks)
                           for ranks in layers))


def contiguous_layer(num_experts, num_ranks):
    """moe_rt's default layout of one layer: experts in contiguous blocks, the first E mod P
    ranks one expert more (rank q from q·(E//P) + min(q, E mod P))."""
    base, extra = divmod(num_experts, num_ranks)
    ranks, first = [], 0
    for q in range(num_ranks):
        count = base + (q < extra)
        ranks.append(list(range(first, first + count)))
        first += count
    return ranks


# ---------------------------------------------------------------------------------------------
# Reading


class _Reader:
    """The state of one file being read line by line."""

    def __init__(self, path):
        self.path = path
        self.line = 0
        self.header_seen = False
        self.sizes = {}                  # "experts" -> E, ...
        self.layers = {}                 # l -> [P] lists of ids, with the line it came from

    def fail(self, problem, at_line=True):
        where = f" line {self.line}" if at_line and self.line else ""
        raise StatsError(f"{self.path}{where}: {problem}")

    def read_line(self, text):
        text = text.split("#", 1)[0].strip(BLANKS)
        if not text:
            return
        words = words_of(text)
        if not self.header_seen:
            if tuple(words) != HEADER:
                found = f"'{text[:60]}'"
                if words[:1] == [HEADER[0]]:
                    self.fail(f"version {' '.join(words[1:]) or '(none)'}: this reader knows "
                              f"'{' '.join(HEADER)}' only, found {found}")
                self.fail(f"expected the header line '{' '.join(HEADER)}', found {found}")
            self.header_seen = True
        elif words[0] == "layer":
            self.layer_line(text)
        elif words[0] in SIZE_KEYS:
            self.size_line(words)
        else:
            self.fail(f"unknown line '{text[:60]}' (expected experts, layers, ranks or layer "
                      f"lines)")

    def count(self, word):
        """The value of a decimal count, or None where `word` is not one."""
        # The length first: int() refuses a string of more than 4300 digits with a ValueError.
        if len(word) > 12 or not COUNT.fullmatch(word) or int(word) >= COUNT_LIMIT:
            return None
        return int(word)

    def size_line(self, words):
        key = words[0]
        if self.layers:
            self.fail(f"'{key}' after the first layer line")
        if key in self.sizes:
            self.fail(f"'{key}' given twice")
        value = self.count(words[1]) if len(words) == 2 else None
        if not value:
            self.fail(f"'{key}' needs one positive count")
        self.sizes[key] = value

    def layer_line(self, text):
        missing = [key for key in SIZE_KEYS if key not in self.sizes]
        if missing:
            self.fail(f"no '{missing[0]}' line before the first layer line")
        num_experts, num_layers, num_ranks = (self.sizes[key] for key in SIZE_KEYS)
        head, colon, rest = text.partition(":")
        words = words_of(head)
        layer = self.count(words[1]) if len(words) == 2 else None
        if not colon or layer is None:
            self.fail(f"expected 'layer N: experts | experts | ...', found '{text[:60]}'")
        if layer >= num_layers:
            self.fail(f"layer {layer} outside [0, {num_layers})")
        if layer in self.layers:
            self.fail(f"layer {layer} given twice (first on line {self.layers[layer][1]})")
        groups = rest.split("|")
        if len(groups) != num_ranks:
            self.fail(f"layer {layer} lists {len(groups)} ranks, the file says "
                      f"'ranks {num_ranks}'")
        ranks = []
        for q, group in enumerate(groups):
            experts = []
            for word in words_of(group):
                e = self.count(word)
                if e is None:
                    self.fail(f"layer {layer}, rank {q}: '{word[:30]}' is not an expert id")
                experts.append(e)
            ranks.append(experts)
        problem = layer_problem(num_experts, ranks)
        if problem:
            self.fail(f"layer {layer}: {problem}")
        self.layers[layer] = (ranks, self.line)

    def finish(self):
        if not self.header_seen:
            self.fail(f"empty: no '{' '.join(HEADER)}' line", at_line=False)
        missing = [key for key in SIZE_KEYS if key not in self.sizes]
        if missing:
            self.fail(f"no '{missing[0]}' line", at_line=False)
        absent = [l for l in range(self.sizes["layers"]) if l not in self.layers]
        if absent:
            self.fail(f"layer {absent[0]} has no line", at_line=False)
        layers = [self.layers[l][0] for l in range(self.sizes["layers"])]
        return make_placement(self.sizes["experts"], layers, what=self.path)


def read_placement(path):
    """The Placement of the file `path`, checked as moe_rt checks it (without a run to compare
    with: check_placement_fits does that). StatsError naming the file and line otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise StatsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise StatsError(f"{path}: is a directory, not a placement file") from None
    except UnicodeDecodeError:
        raise StatsError(f"{path}: not a text file (not UTF-8)") from None
    except OSError as err:
        raise StatsError(f"{path}: cannot read ({err.strerror or err})") from None
    reader = _Reader(path)
    for number, line in enumerate(text.split("\n"), start=1):
        reader.line = number
        reader.read_line(line)
    return reader.finish()


def check_placement_fits(placement, path, num_experts, num_layers, num_ranks=None):
    """StatsError unless the placement read from `path` has the run's experts and layers (and,
    when given, its number of EP ranks)."""
    for what, got, want in (("experts", placement.num_experts, num_experts),
                            ("layers", placement.num_layers, num_layers),
                            ("EP ranks", placement.num_ranks, num_ranks)):
        if want is not None and got != want:
            raise StatsError(f"{path}: the file places {got} {what}, the run has {want}")


# ---------------------------------------------------------------------------------------------
# Writing


def placement_text(placement, comments=()):
    """The file's text: each comment as a '# ' line, the header, the sizes, a line per layer."""
    lines = [f"# {line}".rstrip() for comment in comments for line in comment.splitlines()]
    lines += [" ".join(HEADER), f"experts {placement.num_experts}",
              f"layers {placement.num_layers}", f"ranks {placement.num_ranks}"]
    for l, ranks in enumerate(placement.layers):
        lines.append(f"layer {l}: " + " | ".join(" ".join(str(e) for e in experts)
                                                 for experts in ranks))
    return "\n".join(lines) + "\n"


def write_placement(path, placement, comments=()):
    """Writes `placement` to `path` with `comments` (lines of text) at the top; returns path."""
    make_placement(placement.num_experts, placement.layers, what=path)   # never write a bad one
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(placement_text(placement, comments))
    except OSError as err:
        raise StatsError(f"{path}: cannot write the placement ({err.strerror or err})") from None
    return path
