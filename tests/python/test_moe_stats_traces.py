"""`moe_stats.py traces` on fixture traces whose routing is known: hash layers never change and
always send an id to the same experts; top-k layers change every id's experts once, between the
traced steps 5 and 10."""
import pytest

import moe_stats
import stats_fixture as sf


def traced_file(path, variant):
    run = sf.build_run(variant)
    return sf.write_stats(str(path), run, traces=sf.build_traces(run))


def table_rows(out):
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("layer  routing"))
    return [line.split() for line in lines[start + 1:start + 1 + sf.NUM_LAYERS]]


def test_stability_frequency_and_bias(cli, tmp_path):
    code, out, err = cli("traces", traced_file(tmp_path / "a.h5", "A"))
    assert code == 0, err
    assert out.startswith("traced steps  5: 0, 5, 10, 15, 20")
    for layer, cells in enumerate(table_rows(out)):
        changed, focus = cells[3], cells[-1]
        assert changed == ("0.000" if layer < sf.NUM_HASH else "0.250")   # 1 of 4 step pairs
        assert focus == "1.000"
    assert out.count("the bias is 0 at every traced step") == sf.NUM_LAYERS
    code, out, err = cli("traces", traced_file(tmp_path / "b.h5", "B"))
    assert code == 0, err
    assert out.count("the bias is 0 at every traced step") == sf.NUM_HASH
    assert out.count("not computable") == sf.NUM_LAYERS - sf.NUM_HASH
    assert "has no /trace/experts_unbiased" in out


def test_bias_agreement_from_the_unbiased_top_k(cli, tmp_path):
    # The top-k layers agree at steps 0 and 5 and differ at 10, 15 and 20: 2 of 5 traced steps.
    run = sf.build_run("B")
    path = sf.write_stats(str(tmp_path / "u.h5"), run, traces=sf.build_traces(run, unbiased=True))
    code, out, err = cli("traces", path)
    assert code == 0, err
    assert out.count("0.400 (step 0: 1.000, step 20: 0.000)") == sf.NUM_LAYERS - sf.NUM_HASH
    assert out.count("1.000 (step 0: 1.000, step 20: 1.000)") == sf.NUM_HASH


def test_frequent_tokens_are_those_making_half_the_occurrences():
    run = sf.build_run("A")
    ids = sf.build_traces(run)["trace/token_id"]
    frequent, rare = moe_stats._traces.frequency_groups(list(ids))
    values, counts = zip(*sorted(((v, int((ids == v).sum())) for v in set(ids.reshape(-1))),
                                 key=lambda p: -p[1]))
    assert frequent | rare == set(values) and not frequent & rare
    assert sum(counts[:len(frequent)]) >= ids.size / 2 > sum(counts[:len(frequent) - 1])


def test_a_resumed_run_keeps_the_traces_of_the_steps_it_keeps(tmp_path):
    run = sf.build_run("A")
    traces = sf.build_traces(run)
    first = sf.write_stats(str(tmp_path / "a.h5"), sf.rows_of(run, 0, 13), traces=traces)
    last = sf.write_segment(str(tmp_path / "b.h5"), run, 10, 21, predecessor=first, step=9,
                            traces={k: v[2:] for k, v in traces.items()})   # steps 10, 15, 20
    blocks = moe_stats.load_traces(moe_stats.load_run(last))
    assert [list(b.steps) for b in blocks] == [[0, 5], [10, 15, 20]]   # a.h5's 10 was redone


def test_a_run_without_traces(cli, run_a):
    code, out, err = cli("traces", run_a)
    assert code == 0 and "no traced steps" in out and "--trace-every" in out
