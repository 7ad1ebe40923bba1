"""The bench library: metrics, plots, prompt sources."""

import json

import pytest

from dflash_et.evaluate.bench import PLOT_COLUMNS, BenchConfig, run_bench
from dflash_et.data.prompts import load_prompts, with_documents
from tests.tiny_programs import flat_cost_curve


def test_bench_metrics_and_plots(programs, monkeypatch):
    """auto as the headline, beside the fixed blocks the programs take (8 at most: 32 is skipped, said so).

    auto plans by a fixed curve (flat_cost_curve), so what it does is decided by the draft, not by the machine's
    load; test_adaptive times real curves."""
    import dflash_et.runtime.engine as engine_module

    monkeypatch.setattr(engine_module, "measure_cost_curve", flat_cost_curve)
    metrics, plots, curve = run_bench(programs, "auto", BenchConfig(num_prompts=3, long_prompts=2, max_new_tokens=12,
                                                                    latency_repeats=1, block_sizes=(2, 8, 32)))
    for key in ("tau", "speedup", "ar_tokens_per_s", "dflash_tokens_per_s", "block_size", "draft_ms_per_round",
                "verify_ms_per_round", "host_ms_per_round", "verify_cost_ratio", "acceptance_histogram",
                "speedup_auto", "tau_auto", "mean_verify_tokens_auto", "speedup_range_over_repeats"):
        assert key in metrics
    assert metrics["block_size"] == "auto" and metrics["lossless"] is True and metrics["prompts"] == 3 + 2
    assert metrics["block_sizes_skipped"] == [32] and set(metrics["speedup_by_block"]) == {"2", "8"}
    assert (metrics["tau"], metrics["speedup"]) == (metrics["tau_auto"], metrics["speedup_auto"])
    categories = {"math", "code", "chat", "long"}  # long: a document, then a question (test_long_prompts)
    assert set(metrics["tau_by_category"]) == set(metrics["speedup_auto_by_category"]) == categories
    assert set(metrics["speedup_by_block_by_category"]["code"]) == {"2", "8"}
    # the fixed curve says 1 ms a plain step: the ratio is each category's mean plain step in ms, as decoding paid
    assert set(metrics["plain_step_vs_cost_curve_by_category"]) == categories
    assert all(0 < v < 1000 for v in metrics["plain_step_vs_cost_curve_by_category"].values())
    for c in categories:  # greedy, each repeat emits the same tokens: the pooled speedup lies in the range
        low, high = metrics["speedup_range_over_repeats_by_category"][c]["auto"]
        assert 0 < low <= metrics["speedup_auto_by_category"][c] * (1 + 1e-9) and low <= high
        assert metrics["speedup_auto_by_category"][c] <= high * (1 + 1e-9)
    choices = metrics["auto_rounds_by_category"]
    assert sum(sum(c.values()) for c in choices.values()) == metrics["rounds"]
    sources = metrics["auto_sources"]  # the draft's, lookup's, none (plain steps)
    assert "draft" in sources and set(sources) <= {"draft", "lookup", "plain"}
    assert sum(s["share"] for s in sources.values()) == pytest.approx(1) and sources["draft"]["tau"] > 1
    assert sum(c.get("lookup", 0) for c in choices.values()) == round(sources.get("lookup", {}).get("share", 0)
                                                                      * metrics["rounds"])
    assert metrics["tau_auto"] > 1.5 and 1 <= metrics["mean_verify_tokens_auto"] <= 8  # proposals accepted
    assert curve.max_block == 8 and curve.programs
    assert [r["block"] for r in plots["speedup_by_block"]] == ["2", "8", "auto"]
    assert [r["tokens"] for r in plots["cost_curve"]] == list(range(1, 9)) and plots["cost_curve"][0]["draft_ms_start"] == 0
    assert len(plots["acceptance"]) == 8
    assert {(r["category"], r["mode"]) for r in plots["tokens_per_s"]} == {
        (c, m) for c in categories for m in ("ar", "2", "8", "auto")}
    assert {name: tuple(rows[0]) for name, rows in plots.items()} == PLOT_COLUMNS  # a skipped bench's headers


def test_bench_headline_can_be_a_fixed_block(programs):
    metrics, _, _ = run_bench(programs, 4, BenchConfig(num_prompts=2, long_prompts=0, max_new_tokens=8,
                                                       latency_repeats=1, block_sizes=(2,)))
    assert set(metrics["speedup_by_block"]) == {"2", "4"} and metrics["tau"] == metrics["tau_by_block"]["4"]
    # a fixed block drafts every round but a reply's last when one token is left to emit (a plain step)
    drafted, replies = sum(metrics["acceptance_histogram"].values()), metrics["prompts"] * metrics["repeats"]
    assert metrics["rounds"] - replies <= drafted <= metrics["rounds"] and drafted > 0
    with pytest.raises(ValueError, match=r"bench.block_sizes must all be at least 2"):
        run_bench(programs, 4, BenchConfig(block_sizes=(1, 4)))


def test_prompts_from_jsonl(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hello", "category": "chat"}\n\n{"question": "1+1?"}\n{"turns": ["hi", "more"]}\n')
    assert load_prompts(str(f), 10) == [{"category": "chat", "prompt": "hello"},
                                        {"category": "file", "prompt": "1+1?"}, {"category": "file", "prompt": "hi"}]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: no 'prompt', 'question' or 'turns' field"):
        load_prompts(str(tmp_path / "bad.jsonl"), 10)
    with pytest.raises(ValueError, match="not 'builtin', a JSONL file, 'hf:<dataset>' or one of"):
        load_prompts(str(tmp_path / "missing.jsonl"), 10)


def test_prompts_from_a_dataset(tmp_path, monkeypatch):
    """Datasets load through `datasets.load_dataset`; a local directory stands in for the hub here."""
    from dflash_et.data import prompts

    data = tmp_path / "gsm8k-like"
    data.mkdir()
    (data / "test.jsonl").write_text("".join(json.dumps({"question": f"q{i}", "answer": "a"}) + "\n" for i in range(5)))
    assert load_prompts(f"hf:{data}@test", 3) == [{"category": "gsm8k-like", "prompt": f"q{i}"} for i in range(3)]
    monkeypatch.setitem(prompts.DATASETS, "gsm8k", (str(data), None, "test"))
    assert load_prompts("gsm8k", 2) == [{"category": "gsm8k", "prompt": "q0"}, {"category": "gsm8k", "prompt": "q1"}]
    with pytest.raises(ValueError, match="cannot load dataset .*use a local JSONL file or 'builtin'"):
        load_prompts(f"hf:{tmp_path / 'nothing'}", 3)


@pytest.mark.parametrize("source", ["builtin", "assistant"])
def test_long_prompts_are_a_document_then_a_question(source):
    """The long category: lengths spread from half to all of the room the reply leaves, each ending on one of the
    measured questions after a document of train-split texts only (no measured question inside it)."""
    from dflash_et.checkpoints import builtin
    from dflash_et.data.chat import encode_chat
    from dflash_et.evaluate.bench_runs import long_rows

    tok = builtin.build_tokenizer()
    rows = load_prompts(source, 4)
    config = BenchConfig(prompts=source, long_prompts=5, max_new_tokens=64)
    long = long_rows(rows, config, 1024, lambda p: len(encode_chat(tok, p)))
    lengths = [len(encode_chat(tok, r["prompt"])) for r in long]
    room = 1024 - 64
    assert [r["category"] for r in long] == ["long"] * 5 and all(room // 2 - 200 < n <= room for n in lengths)
    assert lengths[-1] > room - 200 and lengths[0] <= room // 2
    def last(prompt):  # a conversation's document and question are in its last turn
        return prompt if isinstance(prompt, str) else prompt[-1]["content"]

    measured = [last(q["prompt"]) for q in load_prompts(source, 30)]
    for row, question in zip(long, rows + rows):
        document, _, asked = last(row["prompt"]).rpartition("\n\nQuestion: ")
        assert asked == last(question["prompt"]) and not any(q in document for q in measured)
    assert long_rows(rows, BenchConfig(long_prompts=0), 1024, len) == []
    with pytest.raises(ValueError, match="no texts to make a document of"):
        with_documents(["q"], [], [100], len)


def test_builtin_prompts_cover_categories():
    rows = load_prompts("builtin", 9)
    assert [r["category"] for r in rows] == ["math", "code", "chat"] * 3


def test_bench_without_prompts_fails_before_loading_anything(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="bench.prompts=.*empty.jsonl' has no prompts"):
        run_bench(tmp_path / "no-programs", 8, BenchConfig(prompts=str(tmp_path / "empty.jsonl")))


def test_every_registered_metric_and_plot_reaches_bench_json_the_printout_and_the_csvs(programs, tmp_path, monkeypatch,
                                                                                        capsys):
    """bench.json, the stage's printout and the plot CSVs read one registry: what is registered there (a metric, a
    line of the printout, a plot) comes out of the stage with no other change."""
    import stages.bench
    from dflash_et.evaluate import bench

    def tokens_decoded(runs: bench.Runs) -> int:
        return sum(len(g.tokens) - 1 for g in runs.pooled(runs.headline))

    def tau_rows(runs: bench.Runs) -> list[dict]:
        return [{"category": c, "tau": t} for c, t in bench.tau_by_category(runs).items()]

    monkeypatch.setitem(bench.METRICS, "tokens_decoded", tokens_decoded)
    monkeypatch.setattr(bench, "HEADLINE", (*bench.HEADLINE, ("tokens_decoded", "tau")))
    monkeypatch.setitem(bench.PLOTS, "tau_by_category", (("category", "tau"), tau_rows))
    monkeypatch.setattr(stages.bench, "params", lambda: {"block_size": "auto", "bench": {
        "num_prompts": 3, "long_prompts": 1, "max_new_tokens": 8, "latency_repeats": 1, "block_sizes": [2, 32]}})
    paths = [tmp_path / "bench.json", tmp_path / "plots", tmp_path / "cost_curve.json"]
    capsys.readouterr()
    stages.bench.main([str(programs), *map(str, paths)])
    printed = capsys.readouterr().out
    metrics = json.loads(paths[0].read_text())
    assert list(metrics) == list(bench.METRICS)  # every metric (greedy, a block skipped: none left out), in order
    assert metrics["tokens_decoded"] > 0 and metrics["block_sizes_skipped"] == [32]
    assert f"[bench] tokens_decoded={metrics['tokens_decoded']} tau={metrics['tau']:.2f}\n" in printed
    for name in (n for line in bench.HEADLINE for n in line):
        assert f"{name}=" in printed, name
    assert (paths[1] / "tau_by_category.csv").read_text().splitlines()[0] == "category,tau"
    for name, (columns, _) in bench.PLOTS.items():
        assert (paths[1] / f"{name}.csv").read_text().splitlines()[0] == ",".join(columns)
