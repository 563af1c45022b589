#!/usr/bin/env python3
"""moe_rt's training step in tuned eager-mode PyTorch on the CPU, for a tokens/s comparison.

The model and step of moe_rt's `deepseek4-tiny` preset (docs/architecture.md, "The model";
runtime/options/presets.cpp), or `deepseek4-fine` with --model, written as a PyTorch user would
write it for speed without torch.compile: fused QKV projection, RoPE as a complex multiply,
scaled_dot_product_attention with a boolean sliding-window causal mask, experts run on the
tokens sorted by expert (grouped GEMM, or one GEMM per expert, or a padded bmm: --experts),
fused AdamW, gradients set to None. Float32 throughout. Needs torch >= 2.5 (enable_gqa,
F.rms_norm); the default grouped-GEMM experts need a torch with F.grouped_mm (2.15 has it; else
the per-expert loop is the default). Install: pip install torch (or, where that index is
reachable, pip install torch --index-url https://download.pytorch.org/whl/cpu).

On deepseek4-tiny at batch 8 and one thread, F.grouped_mm measured ahead of the per-expert loop
(fewer autograd nodes and elementwise calls: one SwiGLU over all rows instead of one per expert)
and of the padded bmm (which computes the padding); SDPA's CPU flash kernel with the boolean
mask ahead of an explicit masked-softmax bmm and of a banded two-block formulation.

One step is what moe_rt's step computes on one rank: embedding; per layer x += Attn(RMSNorm(x))
and x += MoE(RMSNorm(x)) (hash routing in the first layers, biased top-k of sqrt(softplus(logit))
scores in the others, combine weights from the unbiased scores times the route scale, SwiGLU
experts clamped at the limit, one unweighted shared expert); final RMSNorm, untied LM head,
cross-entropy averaged over the step's tokens plus the sequence-wise balance loss (weight 1e-4,
DeepSeek form); backward; global-norm clip at 1.0; AdamW (betas 0.9/0.95, eps 1e-8, decoupled
weight decay 0.1 except on norm weights, lr 3e-3 after 10 warmup steps, cosine to 10%); the
loss-free bias update b += 0.01·sign(mean load − load) of the top-k layers.

Run:

    python3 bench/torch_step.py [--threads N] [--batch B] [--steps 23] [--warmup 3]

--batch is sequences per step (default 8, i.e. 8 × 256 tokens). The batches are drawn before
the timed loop (uniform random token ids by default; --data markov gives a learnable chain, to
see the loss fall). Compare with moe_rt on the same cores and thread count:

    mpiexec -np 1 --bind-to none build/moe_rt --batch-per-rank 8 --threads 1 --steps 23 \\
        --stats none

(as root, with OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the environment),
whose summary prints "median N tokens/s" over its steps after the first; this script prints the
median over its timed steps, after --warmup untimed ones. Both count model FLOP/s as
3 × (forward FLOPs per token) × tokens/s, with moe_rt's count (model/model.cpp,
model_forward_flops_per_token: useful FLOPs, sliding-window keys only; 4.210 MFLOP forward per
token for deepseek4-tiny).

The same as moe_rt: the parameter count (printed beside moe_rt's), the RoPE pairs (2i, 2i+1)
and frequencies, the window (query s sees keys s − W < j <= s), the initial distributions
(normal, std 0.02, the output projections 0.02/sqrt(2L), norm weights 1). What differs by
construction: the hash tables and initial values come from torch's generator, not moe_rt's
counter-based streams; sums round as MKL and torch add them, not in moe_rt's fixed order;
torch.topk breaks exact ties its own way (moe_rt: the lower index); moe_rt makes each step's
batch inside the timed step (a few microseconds), this script before the loop.
"""

import argparse
import dataclasses
import math
import platform
import statistics
import time

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 2048
    d_model: int = 128
    layers: int = 7
    hash_layers: int = 3
    heads: int = 4
    kv_heads: int = 1
    head_dim: int = 32
    experts: int = 8
    top_k: int = 3
    shared_experts: int = 1
    ffn_dim: int = 128
    seq_len: int = 256
    route_scale: float = 1.5
    swiglu_limit: float = 10.0
    rope_theta: float = 10000.0
    sliding_window: int = 128
    norm_eps: float = 1e-6
    routing_groups: int = 1  # G: group-limited top-k when > 1
    group_topk: int = 1  # M: groups a token may use


PRESETS = {
    "deepseek4-tiny": Config(),
    "deepseek4-fine": Config(experts=64, top_k=8, ffn_dim=56, routing_groups=8, group_topk=4),
}


@dataclasses.dataclass(frozen=True)
class Training:
    """moe_rt's defaults (runtime/options/options.hpp, model/routing_config.hpp)."""

    lr: float = 3e-3
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    balance_weight: float = 1e-4
    bias_rate: float = 0.01


def forward_flops_per_token(c):
    """moe_rt's model_forward_flops_per_token (model/model.cpp): GEMM FLOPs, windowed keys."""
    d, hd, kvd = c.d_model, c.heads * c.head_dim, c.kv_heads * c.head_dim
    f, fs = c.ffn_dim, c.shared_experts * c.ffn_dim
    window = c.sliding_window
    keys = sum(min(s + 1, window) if window > 0 else s + 1 for s in range(c.seq_len)) / c.seq_len
    attention = 2 * d * (2 * hd + 2 * kvd) + 2 * 2 * hd * keys
    moe = 2 * d * c.experts + c.top_k * 6 * d * f + 6 * d * fs
    return c.layers * (attention + moe) + 2 * d * c.vocab


def moe_rt_param_counts(c):
    """(replicated, expert) parameters of moe_rt's layout (model/model.cpp, moe_layer.cpp)."""
    v, d, e, f = c.vocab, c.d_model, c.experts, c.ffn_dim
    hd, kvd, fs = c.heads * c.head_dim, c.kv_heads * c.head_dim, c.shared_experts * c.ffn_dim
    dense = 2 * v * d + c.layers * (2 * d + 2 * d * hd + 2 * d * kvd + d * e + 3 * d * fs) + d
    return dense, c.layers * e * 3 * d * f


def lr_at_step(step, total, t):
    """moe_rt's lr_at_step (model/optimizer.cpp): linear warmup, then cosine to min_lr_ratio."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    decay_steps = total - t.warmup_steps
    if decay_steps <= 1:
        return t.lr
    progress = min(1.0, (step - t.warmup_steps) / (decay_steps - 1))
    return t.lr * (t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


# ---------------------------------------------------------------------------------------------
# Routed experts: three formulations of the same computation over the token copies sorted by
# expert. x [R, D] holds the rows of expert 0, then expert 1, ...; counts [E] their numbers.


def swiglu(gv, limit):
    """silu(min(g, limit)) · clamp(v, ±limit) of gv = [g | v]; no clamp when limit <= 0."""
    g, v = gv.chunk(2, dim=-1)
    if limit > 0:
        g, v = g.clamp(max=limit), v.clamp(-limit, limit)
    return F.silu(g) * v


def experts_grouped(x, counts, w13, w2, limit):
    """torch.nn.functional.grouped_mm over the expert slices (one call per matrix)."""
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    h = swiglu(F.grouped_mm(x, w13, offs=offsets), limit)
    return F.grouped_mm(h, w2, offs=offsets)


def experts_loop(x, counts, w13, w2, limit):
    """One matmul per expert on its contiguous slice of x."""
    out = []
    for e, rows in enumerate(torch.split(x, counts.tolist())):
        if rows.shape[0] > 0:
            out.append(swiglu(rows @ w13[e], limit) @ w2[e])
    return torch.cat(out)


def experts_bmm(x, counts, w13, w2, limit):
    """One bmm over [E, C, D], every expert padded with zero rows to the largest count C."""
    num_experts, cap = counts.shape[0], int(counts.max())
    starts = torch.cumsum(counts, 0) - counts
    expert = torch.repeat_interleave(torch.arange(num_experts), counts)
    slot = expert * cap + torch.arange(x.shape[0]) - starts[expert]
    padded = x.new_zeros(num_experts * cap, x.shape[1]).index_copy(0, slot, x)
    h = swiglu(torch.bmm(padded.view(num_experts, cap, -1), w13), limit)
    return torch.bmm(h, w2).view(num_experts * cap, -1).index_select(0, slot)


EXPERT_IMPLS = {"grouped": experts_grouped, "loop": experts_loop, "bmm": experts_bmm}


# ---------------------------------------------------------------------------------------------
# The model.


def rope_table(c):
    """exp(i·s·ω_j), ω_j = theta^(-2j/hd): rotates each pair (x[2j], x[2j+1]) of row s."""
    omega = c.rope_theta ** (-torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim)
    angle = torch.outer(torch.arange(c.seq_len, dtype=torch.float64), omega)
    return torch.polar(torch.ones_like(angle), angle).to(torch.complex64)  # [S, hd/2]


def window_mask(c):
    """True where query s may see key j: s − W < j <= s (W = 0: every j <= s)."""
    s = torch.arange(c.seq_len)
    diff = s[:, None] - s[None, :]
    visible = diff >= 0
    if c.sliding_window > 0:
        visible &= diff < c.sliding_window
    return visible


class Layer(torch.nn.Module):
    def __init__(self, c, hash_table=None):
        super().__init__()
        std, out_std = 0.02, 0.02 / math.sqrt(2 * c.layers)
        d, hd, kvd = c.d_model, c.heads * c.head_dim, c.kv_heads * c.head_dim
        f, fs, e = c.ffn_dim, c.shared_experts * c.ffn_dim, c.experts

        def normal(*shape, scale=std):
            return torch.nn.Parameter(torch.randn(*shape) * scale)

        self.c = c
        self.attn_norm = torch.nn.Parameter(torch.ones(d))
        self.wqkv = normal(hd + 2 * kvd, d)  # rows: q of every head, then k, then v
        self.wo = normal(d, hd, scale=out_std)
        self.moe_norm = torch.nn.Parameter(torch.ones(d))
        self.router = normal(e, d)
        self.shared_w13 = normal(2 * fs, d) if fs > 0 else None  # rows: W1ᵀ, then W3ᵀ
        self.shared_w2 = normal(d, fs, scale=out_std) if fs > 0 else None
        self.w13 = normal(e, d, 2 * f)  # [D, 2F] of each expert: W1 | W3
        self.w2 = normal(e, f, d, scale=out_std)
        self.hash_routed = hash_table is not None
        if self.hash_routed:
            self.register_buffer("hash_table", hash_table)
        else:
            self.register_buffer("bias", torch.zeros(e))

    def attention(self, h, rope, mask):
        c = self.c
        b, s, _ = h.shape
        heads, kv = c.heads, c.kv_heads
        qkv = F.linear(h, self.wqkv).view(b, s, heads + 2 * kv, c.head_dim)
        # RoPE on q and k at once: the pairs as complex numbers times exp(i·s·ω)
        qk = torch.view_as_complex(qkv[:, :, :heads + kv].unflatten(-1, (-1, 2)))
        qk = torch.view_as_real(qk * rope[:, None, :]).flatten(-2)
        q = qk[:, :, :heads].transpose(1, 2)
        k = qk[:, :, heads:].transpose(1, 2)
        v = qkv[:, :, heads + kv:].transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=kv != heads)
        return F.linear(o.transpose(1, 2).reshape(b, s, -1), self.wo)

    def select(self, scores, token_ids):
        """[N, K] expert ids: the hash table row of the token, or top-k of scores + bias."""
        c = self.c
        if self.hash_routed:
            return self.hash_table[token_ids]
        biased = scores + self.bias
        if c.routing_groups > 1:
            # A group scores by its best K/M biased scores; only the M best groups stay.
            n = biased.shape[0]
            grouped = biased.view(n, c.routing_groups, -1)
            group_score = grouped.topk(c.top_k // c.group_topk, dim=-1).values.sum(-1)
            kept = group_score.topk(c.group_topk, dim=-1).indices
            allowed = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept, True)
            biased = grouped.masked_fill(~allowed[:, :, None], -math.inf).view(n, -1)
        return biased.topk(c.top_k, dim=-1).indices

    def balance_loss(self, scores, batch):
        """DeepSeek's sequence-wise balance loss Σ_e f_e·P_e, summed over sequences (weight 1)."""
        c = self.c
        s = scores.view(batch, c.seq_len, c.experts)
        with torch.no_grad():  # f: the unbiased top-k's share of each expert, times E/K
            top = scores.detach().topk(c.top_k, dim=-1).indices.view(batch, -1)
            ones = torch.full(top.shape, c.experts / (c.top_k * c.seq_len))
            f = torch.zeros(batch, c.experts).scatter_add_(1, top, ones)
        p = (s / s.sum(-1, keepdim=True)).mean(1)
        return (f * p).sum()

    def moe(self, u, token_ids, experts):
        """MoE(u) for u [N, D]: the output, the balance loss (None on hash layers), the loads."""
        c = self.c
        scores = torch.sqrt(F.softplus(F.linear(u, self.router)))  # [N, E]
        with torch.no_grad():
            sel = self.select(scores.detach(), token_ids)
            flat = sel.flatten()
            counts = torch.bincount(flat, minlength=c.experts)
            order = torch.argsort(flat, stable=True)  # the token copies, expert by expert
            rows = order // c.top_k
        chosen = scores.gather(1, sel)
        weights = chosen / (chosen.sum(-1, keepdim=True) + 1e-20) * c.route_scale
        y = experts(u.index_select(0, rows), counts, self.w13, self.w2, c.swiglu_limit)
        y = y * weights.flatten().index_select(0, order)[:, None]
        if self.shared_w13 is not None:
            out = F.linear(swiglu(F.linear(u, self.shared_w13), 0.0), self.shared_w2)
        else:
            out = torch.zeros_like(u)
        out = out.index_add(0, rows, y)
        if self.hash_routed:
            return out, None, counts
        return out, self.balance_loss(scores, u.shape[0] // c.seq_len), counts

    def forward(self, x, token_ids, rope, mask, experts):
        c = self.c
        x = x + self.attention(F.rms_norm(x, (c.d_model,), self.attn_norm, c.norm_eps), rope, mask)
        h = F.rms_norm(x, (c.d_model,), self.moe_norm, c.norm_eps)
        y, balance, counts = self.moe(h.view(-1, c.d_model), token_ids.flatten(), experts)
        return x + y.view_as(x), balance, counts


class Model(torch.nn.Module):
    def __init__(self, c, experts):
        super().__init__()
        self.c = c
        self.experts = experts
        self.embed = torch.nn.Parameter(torch.randn(c.vocab, c.d_model) * 0.02)
        layers = []
        for i in range(c.layers):
            table = None
            if i < c.hash_layers:  # K distinct experts per token id
                table = torch.rand(c.vocab, c.experts).argsort(dim=1)[:, :c.top_k].contiguous()
            layers.append(Layer(c, table))
        self.layers = torch.nn.ModuleList(layers)
        self.final_norm = torch.nn.Parameter(torch.ones(c.d_model))
        self.lm_head = torch.nn.Parameter(torch.randn(c.vocab, c.d_model) * 0.02)
        self.register_buffer("rope", rope_table(c))
        self.register_buffer("mask", window_mask(c))

    def forward(self, tokens):
        """Logits [B, S, V], the summed balance losses (per sequence, unweighted), the loads."""
        x = F.embedding(tokens, self.embed)
        balance, loads = torch.zeros(()), []
        for layer in self.layers:
            x, b, counts = layer(x, tokens, self.rope, self.mask, self.experts)
            if b is not None:
                balance = balance + b
                loads.append(counts)
        x = F.rms_norm(x, (self.c.d_model,), self.final_norm, self.c.norm_eps)
        return F.linear(x, self.lm_head), balance, loads

    def counts(self):
        """(replicated, expert) parameter counts, split as moe_rt's two arenas."""
        expert = sum(p.numel() for n, p in self.named_parameters() if n.split(".")[-1] in
                     ("w13", "w2"))
        return sum(p.numel() for p in self.parameters()) - expert, expert

    @torch.no_grad()
    def update_bias(self, loads, rate):
        """moe_rt's loss-free balancing: b += rate·sign(mean − load) in each top-k layer."""
        topk_layers = [layer for layer in self.layers if not layer.hash_routed]
        for layer, load in zip(topk_layers, loads):
            load = load.to(torch.float64)
            layer.bias += (rate * torch.sign(load.mean() - load)).to(layer.bias.dtype)


# ---------------------------------------------------------------------------------------------
# Data, the step, the run.


def markov_batches(c, count, batch, gen):
    """Samples of a fixed first-order chain like moe_rt's synthetic source: Zipf(1) unigram z,
    4..8 successors per token drawn from z with Dirichlet(1) weights, smoothed by 0.05·z."""
    v = c.vocab
    zipf = 1.0 / torch.arange(1, v + 1, dtype=torch.float64)
    zipf /= zipf.sum()
    succ = torch.multinomial(zipf.expand(v, v), 8, replacement=False, generator=gen)
    weight = -torch.log(torch.rand(v, 8, generator=gen, dtype=torch.float64))  # Dirichlet(1)
    weight *= torch.arange(8)[None, :] < torch.randint(4, 9, (v, 1), generator=gen)
    trans = 0.05 * zipf.expand(v, v).clone()
    trans.scatter_add_(1, succ, 0.95 * weight / weight.sum(1, keepdim=True))
    n = count * batch
    tokens = torch.empty(n, c.seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.multinomial(zipf, n, replacement=True, generator=gen)
    for t in range(c.seq_len):
        tokens[:, t + 1] = torch.multinomial(trans[tokens[:, t]], 1, generator=gen)[:, 0]
    return tokens.view(count, batch, c.seq_len + 1)


def make_optimizer(model, t):
    """AdamW as moe_rt applies it: decoupled decay on every weight but the norms'."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.split(".")[-1].endswith("norm") else decay).append(p)
    groups = [{"params": decay, "weight_decay": t.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=t.lr, betas=t.betas, eps=t.eps)
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs), "fused"
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, foreach=True, **kwargs), "foreach"


def train_step(model, opt, params, tokens, lr, t):
    """One step; returns (cross-entropy, weighted balance loss, gradient norm before clipping)."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits, balance, loads = model(inputs)
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    # moe_rt's weight α/(sequences of the step), on each sequence's Σ_e f_e·P_e
    balance = balance * (t.balance_weight / tokens.shape[0])
    (ce + balance).backward()
    norm = torch.nn.utils.clip_grad_norm_(params, t.grad_clip, foreach=True)
    ce, balance, norm = ce.item(), float(balance.detach()), norm.item()
    if not (math.isfinite(ce) and math.isfinite(norm)):
        raise SystemExit(f"non-finite loss {ce} or gradient norm {norm}: stopping, as moe_rt does")
    opt.step()
    model.update_bias(loads, t.bias_rate)
    return ce, balance, norm


def header(args, c, model, opt_kind, flops):
    print(f"torch {torch.__version__}, python {platform.python_version()}, "
          f"{torch.get_num_threads()} threads ({torch.get_num_interop_threads()} inter-op)")
    for line in torch.__config__.show().splitlines():
        line = line.strip(" -")
        if line.startswith("Build settings"):  # of its many fields, the BLAS library's
            line = next((f for f in line.split(", ") if f.startswith("BLAS_INFO")), "")
        if any(word in line for word in ("Math Kernel", "MKL-DNN", "OpenBLAS", "BLAS_INFO",
                                         "CPU capability", "OpenMP")):
            print("  " + line)
    print(f"  oneDNN (mkldnn) available: {torch.backends.mkldnn.is_available()}")
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        print(f"  cpu: {cpu}")
    except (OSError, StopIteration):
        pass
    dense, expert = model.counts()
    print(f"model {args.model}: V={c.vocab} D={c.d_model} L={c.layers} ({c.hash_layers} hash) "
          f"heads={c.heads}/{c.kv_heads}x{c.head_dim} E={c.experts} K={c.top_k} "
          f"shared={c.shared_experts} F={c.ffn_dim} S={c.seq_len} window={c.sliding_window}"
          + (f" groups={c.routing_groups}/{c.group_topk}" if c.routing_groups > 1 else ""))
    ref = moe_rt_param_counts(c)
    same = "the same as" if (dense, expert) == ref else "DIFFERENT from"
    print(f"parameters: {dense:,} replicated + {expert:,} in experts = {dense + expert:,} "
          f"({same} moe_rt's {ref[0]:,} + {ref[1]:,})")
    print(f"batch {args.batch} x {c.seq_len} = {args.batch * c.seq_len} tokens per step; "
          f"experts: {args.experts}; AdamW: {opt_kind}; data: {args.data}")
    print(f"model FLOPs per token: 3 x {flops / 1e6:.3f} MFLOP forward = "
          f"{3 * flops / 1e6:.3f} MFLOP (moe_rt's count)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", choices=sorted(PRESETS), default="deepseek4-tiny")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    parser.add_argument("--steps", type=int, default=23, help="timed steps (default 23)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--dtype", choices=["float32"], default="float32")
    has_grouped = hasattr(F, "grouped_mm")  # a recent torch's
    parser.add_argument("--experts", choices=sorted(EXPERT_IMPLS),
                        default="grouped" if has_grouped else "loop",
                        help="routed-expert formulation (default: grouped, i.e. F.grouped_mm, "
                        "where this torch has it, else loop)")
    parser.add_argument("--data", choices=["uniform", "markov"], default="uniform",
                        help="uniform random token ids, or a learnable Markov chain")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--quiet", action="store_true", help="no line per step")
    args = parser.parse_args()
    if min(args.threads, args.batch, args.steps) < 1 or args.warmup < 0:
        parser.error("--threads, --batch and --steps must be positive, --warmup not negative")
    if args.experts == "grouped" and not has_grouped:
        parser.error(f"--experts grouped needs F.grouped_mm, which torch {torch.__version__} lacks")

    torch.set_num_interop_threads(1)
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(getattr(torch, args.dtype))
    torch.manual_seed(args.seed)
    c, t = PRESETS[args.model], Training()
    model = Model(c, EXPERT_IMPLS[args.experts])
    params = list(model.parameters())
    opt, opt_kind = make_optimizer(model, t)
    flops = forward_flops_per_token(c)
    header(args, c, model, opt_kind, flops)

    total = args.warmup + args.steps
    gen = torch.Generator().manual_seed(args.seed)
    if args.data == "markov":
        batches = markov_batches(c, total, args.batch, gen)
    else:
        batches = torch.randint(c.vocab, (total, args.batch, c.seq_len + 1), generator=gen)

    tokens_per_step = args.batch * c.seq_len
    times = []
    for step in range(total):
        start = time.perf_counter()
        ce, balance, norm = train_step(model, opt, params, batches[step],
                                       lr_at_step(step, total, t), t)
        seconds = time.perf_counter() - start
        if step >= args.warmup:
            times.append(seconds)
        if not args.quiet:
            print(f"step {step:3d}{'' if step >= args.warmup else ' (warmup)':9s} loss {ce:.4f} "
                  f"balance {balance:.3e} grad_norm {norm:.3f} {seconds * 1e3:8.1f} ms "
                  f"{tokens_per_step / seconds:8.0f} tokens/s")

    median = statistics.median(times)
    rate = tokens_per_step / median
    print(f"\nsummary: {len(times)} timed steps, step median {median * 1e3:.1f} ms "
          f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f})")
    print(f"  median {rate:.0f} tokens/s (min {tokens_per_step / max(times):.0f}, "
          f"max {tokens_per_step / min(times):.0f}) on {args.threads} thread"
          f"{'' if args.threads == 1 else 's'}")
    print(f"  model {3 * flops * rate / 1e9:.2f} GFLOP/s (3 x {flops / 1e6:.3f} MFLOP per token)")


if __name__ == "__main__":
    main()
