"""test_scripts.py: the helpers the benchmark scripts share (scripts/results_common.py, scripts/train_runs.py,
scripts/power_poller.py), and the test runner (test/run_tests.sh) on stand-in programs that break its rules.

CPU only: the GPU peak table against data/gpt_config.h's (a small C program compiled here), GPU name
tags, results files written whole, running a child with its log and step records, the power poller's
step clock and window arithmetic (NVML itself needs a GPU), and the benchmarks' --precision (bench_train.py
and table1.py with stand-in children; torch_gpt.py's float8 layer choice and its error without torchao), and
bench_generate.py's arguments, the train_gpt lines it reads, its bounds and table, its runs of two builds
in turns (--baseline, with stand-in builds: the order, the medians, the tokens compared), and its error
without transformers; decode_trace.py's kernel instances, steps and per-kind times on a stand-in trace.
"""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "test"))
import harness  # noqa: E402
import power_poller  # noqa: E402
import results_common  # noqa: E402
import train_runs  # noqa: E402

WORK = tempfile.mkdtemp(prefix="test_scripts_")
GPU_NAMES = ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA A100-SXM4-80GB",
             "NVIDIA A100 80GB PCIe", "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB"]


def test_peak_tflops_agrees_with_the_c_table():
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise harness.Skip("no C compiler")
    src, exe = os.path.join(WORK, "peaks.c"), os.path.join(WORK, "peaks")
    with open(src, "w") as f:
        f.write('#include "data/gpt_config.h"\n'
                'int main(int argc, char** argv) {\n'
                '    for (int i = 1; i < argc; i++) printf("%.1f\\n", gpu_peak_bf16_tflops(argv[i]));\n'
                '    return 0;\n}\n')
    subprocess.run([cc, "-std=c11", "-I", ROOT, "-o", exe, src], check=True)
    out = subprocess.run([exe, *GPU_NAMES], capture_output=True, text=True, check=True).stdout.split()
    for name, c_peak in zip(GPU_NAMES, out):
        assert float(c_peak) == results_common.peak_tflops(name), (name, c_peak, results_common.peak_tflops(name))


def test_gpu_slug():
    want = {"NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200", "NVIDIA A100-SXM4-80GB": "a100",
            "NVIDIA B200": "b200", "": "gpu"}
    for name, slug in want.items():
        assert results_common.gpu_slug(name) == slug, (name, results_common.gpu_slug(name))


def test_balanced_orders_put_each_item_after_every_other_equally_often():
    """bench_attention's rounds, run back to back: with a rotated order (0 1 2, 1 2 0, 2 0 1) item 0 always
    ran right after 2; with orders balanced only within themselves, the rounds' boundaries were not."""
    assert results_common.balanced_orders(0) == []
    assert results_common.balanced_orders(1) == [[0]]
    for n in range(2, 9):
        orders = results_common.balanced_orders(n)
        assert len(orders) == n - 1, n
        assert all(sorted(order) == list(range(n)) for order in orders), n
        cycle = [item for order in orders for item in order]
        follows = {}
        for before, after in zip(cycle, cycle[1:] + cycle[:1]):  # the last round runs on into the first
            follows[before, after] = follows.get((before, after), 0) + 1
        assert all(before != after for before, after in follows), (n, follows)
        assert len(follows) == n * (n - 1) and set(follows.values()) == {1}, (n, follows)


def test_results_files_are_written_whole():
    path = os.path.join(WORK, "sub", "result.json")
    results_common.write_json(path, {"a": 1})
    results_common.write_json(path, {"a": 2})
    with open(path) as f:
        assert json.load(f) == {"a": 2}
    assert not os.path.exists(path + ".tmp")
    meta = results_common.run_metadata()
    assert set(meta) == {"device", "date", "commit", "command"}, meta


def test_results_name_the_build_of_the_binary_they_ran():
    train_gpt = os.path.join(ROOT, "train_gpt")
    version = subprocess.run([train_gpt, "--version"], capture_output=True, text=True, check=True).stdout
    assert results_common.binary_build(train_gpt) == version.strip().removeprefix("train_gpt "), version
    assert results_common.run_metadata(train_gpt)["build"] == results_common.binary_build(train_gpt)
    old = os.path.join(WORK, "old_train_gpt")  # a build older than --version: it refuses the flag
    with open(old, "w") as f:
        f.write("#!/bin/sh\necho \"$0: unrecognized option '$1'\" >&2\nexit 2\n")
    os.chmod(old, 0o755)
    assert results_common.binary_build(old) == "unknown"
    assert results_common.binary_build(os.path.join(WORK, "no_such_binary")) == "unknown"


def test_results_records_merge_and_tables():
    """The results-file helpers bench_train.py and bench_long_context.py share."""
    path = os.path.join(WORK, "records.json")
    results_common.write_json(path, {"device": "GPU A", "records": [{"impl": "x", "n": 1}]})
    assert results_common.load_previous(path, "GPU A", False) == [{"impl": "x", "n": 1}]
    assert results_common.load_previous(path, "GPU B", False) == []  # another device's file: not kept
    assert results_common.load_previous(path, "GPU A", True) == []  # --fresh
    old = [{"impl": "a", "kv": 0, "v": 1}, {"impl": "b", "v": 2}]
    merged = results_common.merge(old, {"impl": "b", "kv": 0, "v": 3}, ("impl", "kv"), {"kv": 0})
    assert merged == [{"impl": "a", "kv": 0, "v": 1}, {"impl": "b", "kv": 0, "v": 3}], merged
    assert results_common.text_table(["ab", "c"], [["x", "1"], ["yyy", "22"]]).splitlines() == \
        ["ab    c", "x     1", "yyy  22"]
    assert results_common.parse_list("512, 1k,8K", int) == [512, 1024, 8192]
    assert [results_common.length_label(n) for n in (512, 2048, 3000)] == ["512", "2k", "3000"]


def test_step_records_skip_validation_and_a_torn_last_line():
    path = os.path.join(WORK, "log.jsonl")
    with open(path, "w") as f:
        f.write('{"step": 1, "loss": 10.5, "ms": 4.0, "tokens_per_s": 100.0, "tflops_per_gpu": 2.0, "mfu": 0.1}\n'
                '{"step": 1, "val_loss": 10.4}\n'
                '{"step": 2, "loss": 9.5, "ms": 2.0, "tokens_per_s": 200.0, "tflops_per_gpu": 4.0, "mfu": 0.2}\n'
                '{"step": 3, "lo')
    records = train_runs.read_step_records(path)
    assert [r["step"] for r in records] == [1, 2], records
    summary = train_runs.steady_state(records, 1)
    assert summary["ms"] == 2.0 and summary["tflops_per_gpu"] == 4.0, summary
    assert train_runs.read_step_records(os.path.join(WORK, "absent.jsonl")) == []


def test_run_child_logs_output_and_status():
    log = os.path.join(WORK, "child.log")
    rc, wall, poller = train_runs.run_child([sys.executable, "-c", "print('hello'); raise SystemExit(3)"], log, 60)
    assert rc == 3 and wall >= 0, rc
    with open(log) as f:
        text = f.read()
    assert text.startswith("$ ") and "hello" in text, text
    rc, _, _ = train_runs.run_child([sys.executable, "-c", "import time; time.sleep(30)"], log, 1)
    assert rc == "timeout", rc


def test_step_line_clock_times_new_step_lines_once():
    import bench_train
    path = os.path.join(WORK, "steps.jsonl")
    clock = power_poller.StepLineClock(path, bench_train.is_train_gpt_step)
    clock.poll(1.0)  # no file yet
    with open(path, "w") as f:
        f.write('{"step": 1, "loss": 10.5, "ms": 4.0}\n{"step": 1, "val_loss": 10.4}\n{"step": 2, "lo')
    clock.poll(2.0)
    with open(path, "a") as f:
        f.write('ss": 9.5, "ms": 2.0}\n')
    clock.poll(3.0)
    clock.poll(4.0)
    assert clock.times == [2.0, 3.0], clock.times
    torch_clock = power_poller.StepLineClock(os.path.join(WORK, "torch.log"), bench_train.is_torch_step)
    with open(torch_clock.path, "w") as f:
        f.write("$ python3 torch_gpt.py\ntorch 2.11: gpt3-1.3b\nstep     1/6 | loss 11.2 | 2293.8 ms\n")
    torch_clock.poll(5.0)
    assert torch_clock.times == [5.0], torch_clock.times


def test_power_window_covers_the_timed_steps():
    """summarize(): power from the energy counter over the samples between the end of the last warm-up
    step and the end of the last step; clock and cap share as means of those samples."""
    def joules(t):  # 100 W until 2 s, 700 W after
        return 100.0 * t if t < 2.0 else 200.0 + 700.0 * (t - 2.0)

    samples = [(t / 10, joules(t / 10) * 1e3, 1500 + t, t >= 20) for t in range(61)]  # every 0.1 s for 6 s
    step_times = [1.0, 2.0, 4.0, 6.0]  # the ends of steps 1-4
    got = power_poller.summarize(samples, step_times, 2, 2000.0)
    assert abs(got["power_w"] - 700.0) < 1e-6, got
    assert abs(got["joules_per_step"] - 1400.0) < 1e-6 and got["power_capped"] == 1.0, got
    assert abs(got["sm_mhz"] - (1500 + 40)) < 1e-9, got  # the mean of the samples from 2 s to 6 s
    assert power_poller.summarize(samples, step_times, 0, 2000.0) is None  # no end of a warm-up to start from
    assert power_poller.summarize(samples, step_times, 4, 2000.0) is None  # no timed step
    assert power_poller.summarize(samples[:1], step_times, 2, 2000.0) is None


def test_power_poller_without_nvml_says_why():
    saved = power_poller.pynvml
    power_poller.pynvml = None
    try:
        poller = power_poller.PowerPoller("0", os.path.join(WORK, "none.jsonl"), lambda line: True)
        poller.stop()
        assert poller.timed_steps(2, 100.0) is None and "nvidia-ml-py" in poller.error, poller.error
    finally:
        power_poller.pynvml = saved


def test_bench_train_power_table():
    import bench_train
    base = {"model": "gpt3-1.3b", "seqlen": 2048, "micro_batch": 8, "kv_heads": 0, "grad_accum": 8, "status": "ok"}
    ours = {**base, "impl": "train_gpt", "power_w": 700.0, "sm_mhz": 1470.0, "joules_per_step": 1300.0,
            "power_capped": 1.0}
    theirs = {**base, "impl": "torch", "power_w": 705.0, "sm_mhz": 1690.0, "joules_per_step": 1625.0,
              "power_capped": 0.98}
    [row] = bench_train.power_rows([ours, theirs])
    assert row == ["gpt3-1.3b", "2k", "8 x 8", "700", "705", "1470", "1690", "1300", "1625", "1.25x", "100% / 98%"], row
    assert bench_train.power_rows([{**ours, "power_w": None}, {**theirs, "power_w": None}]) == []
    [row] = bench_train.power_rows([ours, {**theirs, "power_w": None}])
    assert row[4] == "-" and row[9] == "-", row


def write_fake(path, body):
    """An executable Python script at path (a stand-in train_gpt or Python for the benchmarks' children)."""
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\n" + body)
    os.chmod(path, 0o755)


def bench_train_records(out):
    [path] = [os.path.join(out, n) for n in os.listdir(out) if n.startswith("train_") and n.endswith(".json")]
    with open(path) as f:
        records = json.load(f)["records"]
    with open(path[:-5] + ".md") as f:
        return {(r["impl"], r.get("precision")): r for r in records}, f.read()


def test_bench_train_precision_runs_each_impl_in_each_precision():
    """bench_train.py --precision bf16,fp8 with stand-in children: train_gpt fp8 gets --precision fp8 and torch
    fp8 gets --fp8 (bf16 runs keep their command lines), records carry the precision, and the precision table
    shows every (impl, precision) with its speed against train_gpt bf16 of the same invocation; without
    --precision there is no such table."""
    import bench_train
    fake_gpt, fake_python = os.path.join(WORK, "fake_train_gpt_prec"), os.path.join(WORK, "fake_python_prec")
    write_fake(fake_gpt, "import json, sys\na = sys.argv\nfp8 = a[a.index('--precision') + 1] == 'fp8' "
               "if '--precision' in a else False\n"
               "with open(a[a.index('--log-file') + 1], 'w') as f:\n"
               "    for step in (1, 2, 3):\n"
               "        f.write(json.dumps({'step': step, 'loss': 10.0, 'ms': 50.0 if fp8 else 100.0}) + '\\n')\n")
    write_fake(fake_python, "import json, sys\na = sys.argv\nms = 160.0 if '--fp8' in a else 200.0\n"
               "json.dump({'status': 'ok', 'torch': 'x', 'step_ms': [ms] * 3}, "
               "open(a[a.index('--result-json') + 1], 'w'))\n")
    shard = os.path.join(WORK, "shard_prec.bin")
    open(shard, "wb").close()
    out = os.path.join(WORK, "bench_prec")
    common = ["--configs", "1.3b-2k", "--train-gpt", fake_gpt, "--python", fake_python, "--train-data", shard,
              "--results-dir", out, "--out", out, "--peak-tflops", "1000", "--warmup", "1", "--timed", "2"]
    assert bench_train.main(common + ["--precision", "bf16,fp8"]) == 0
    runs, md = bench_train_records(out)
    assert set(runs) == {(i, p) for i in ("train_gpt", "torch") for p in ("bf16", "fp8")}, sorted(runs)
    assert runs["train_gpt", "fp8"]["command"].endswith("--precision fp8"), runs["train_gpt", "fp8"]["command"]
    assert "--precision" not in runs["train_gpt", "bf16"]["command"], runs["train_gpt", "bf16"]["command"]
    assert runs["torch", "fp8"]["command"].endswith(" --fp8") and "--fp8" not in runs["torch", "bf16"]["command"]
    assert runs["train_gpt", "fp8"]["log"] != runs["train_gpt", "bf16"]["log"]  # each run keeps its own log
    rows = {(r[3], r[4]): r for r in bench_train.precision_rows(list(runs.values()))}
    assert [rows[k][-2] for k in (("train_gpt", "bf16"), ("train_gpt", "fp8"), ("torch", "bf16"), ("torch", "fp8"))] \
        == ["1.00x", "2.00x", "0.50x", "0.62x"], rows
    assert "| impl | precision |" in md and "| gpt3-1.3b | 2k | 8 x 8 | train_gpt | fp8 |" in md, md
    powered = [{**r, "power_w": 700.0, "power_capped": 1.0, "joules_per_step": 2 * r["step_ms"]} for r in runs.values()]
    rows = {(r[3], r[4]): r for r in bench_train.precision_rows(powered)}
    assert rows["train_gpt", "fp8"][9:] == ["700", "100", "100%", "2.00x", "0.50x"], rows  # W, J, capped, ratios
    # ours/torch of the bf16 table stays bf16 against bf16
    [row] = bench_train.table_rows(list(runs.values()))
    assert row[5] == "2.00x", row
    # fp8 alone in a later invocation: no train_gpt bf16 of that run, so no ratio
    assert bench_train.main(common + ["--precision", "fp8", "--impls", "train_gpt"]) == 0
    runs, _ = bench_train_records(out)
    rows = {(r[3], r[4]): r for r in bench_train.precision_rows(list(runs.values()))}
    assert rows["train_gpt", "fp8"][-2] == "-" and rows["train_gpt", "bf16"][-2] == "1.00x", rows
    # the default: bf16 only, no precision table, train_gpt's command line without --precision
    plain = os.path.join(WORK, "bench_plain")
    assert bench_train.main([*common[:common.index("--results-dir")], "--results-dir", plain, "--out", plain,
                             "--peak-tflops", "1000", "--warmup", "1", "--timed", "2"]) == 0
    runs, md = bench_train_records(plain)
    assert set(runs) == {("train_gpt", "bf16"), ("torch", "bf16")} and "| impl | precision |" not in md, md
    assert "--precision" not in runs["train_gpt", "bf16"]["command"]
    for bad in ("fp16", "bf16,int8", ","):
        try:
            bench_train.parse_args(["--precision", bad])
        except SystemExit:
            continue
        raise AssertionError(f"--precision {bad!r} accepted")


def test_bench_train_torch_fp8_without_torchao_says_how_to_install():
    """The PyTorch child with --fp8 where torchao does not import (a stand-in torchao that raises ImportError
    shadows any installed one): the run fails at once, and the record's note says to pip install torchao."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise harness.Skip("needs PyTorch (test/requirements.txt)")
    import bench_train
    stub = os.path.join(WORK, "no_torchao", "torchao")
    os.makedirs(stub, exist_ok=True)
    with open(os.path.join(stub, "__init__.py"), "w") as f:
        f.write("raise ImportError('No module named torchao (a stand-in of the test)')\n")
    shard = os.path.join(WORK, "shard_ao.bin")
    open(shard, "wb").close()
    out = os.path.join(WORK, "bench_no_torchao")
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.path.dirname(stub) + (os.pathsep + saved if saved else "")
    try:
        rc = bench_train.main(["--configs", "gpt2-124m:64:1", "--total-batch-tokens", "64", "--impls", "torch",
                               "--precision", "fp8", "--torch-device", "cpu", "--compile", "none", "--sdpa", "math",
                               "--train-data", shard, "--results-dir", out, "--out", out, "--timeout", "120",
                               "--warmup", "1", "--timed", "1"])
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    runs, md = bench_train_records(out)
    rec = runs["torch", "fp8"]
    assert rc == 1 and rec["status"] == "error", rec
    assert "torchao" in rec["note"] and "pip install torchao" in rec["note"], rec["note"]
    assert "| torch | fp8 | ERROR |" in md, md


def test_torch_gpt_float8_converts_only_the_block_linears():
    """torch_gpt.float8_filter: the four linear layers of each block whose dimensions are multiples of 16, never
    another Linear (an LM head); float8_api names pip install torchao when torchao does not import; with
    torchao installed, convert_to_float8_ swaps exactly those (emulated on the CPU) and the model still trains."""
    try:
        import torch
    except ImportError:
        raise harness.Skip("needs PyTorch (test/requirements.txt)")
    import torch_gpt as tg

    def selected(cfg):
        return [name for name, m in tg.GPT(cfg).named_modules() if tg.float8_filter(m, name)]

    assert selected(tg.GPTConfig(2, 64, 4, 16)) == [f"blocks.{i}.{n}" for i in (0, 1) for n in tg.FLOAT8_LINEARS]
    assert selected(tg.GPTConfig(2, 40, 5, 16)) == []  # 40 is not a multiple of 16: every block linear has it
    assert not tg.float8_filter(torch.nn.Linear(64, 64), "lm_head")
    assert not tg.float8_filter(torch.nn.Linear(64, 64), "blocks.0.head")
    saved = sys.modules.get("torchao", "absent")
    sys.modules["torchao"] = None  # `import torchao...` raises ImportError
    try:
        tg.float8_api()
        raise AssertionError("float8_api() returned without torchao")
    except tg.MissingDependency as err:
        assert "pip install torchao" in str(err), err
    finally:
        if saved == "absent":
            del sys.modules["torchao"]
        else:
            sys.modules["torchao"] = saved
    try:
        tg.float8_api()
    except tg.MissingDependency:
        return  # torchao is not installed here: the conversion itself is checked where it is
    model = tg.GPT(tg.GPTConfig(1, 64, 4, 16))
    swapped = tg.convert_to_float8_(model, emulate=True)
    assert swapped == [f"blocks.0.{n}" for n in tg.FLOAT8_LINEARS], swapped
    assert all(type(getattr(model.blocks[0], n)).__name__ == "Float8Linear" for n in tg.FLOAT8_LINEARS)
    loss = model(torch.randint(0, 100, (2, 16)), torch.randint(0, 100, (2, 16)))
    loss.backward()
    assert torch.isfinite(loss) and model.blocks[0].qkv.weight.grad is not None


def test_table1_fp8_column():
    """table1.py --precision fp8: the cell runs train_gpt --attn flash2 --precision fp8 (bf16 cells as before),
    and the paper-layout table gains the FA2 FP8 column and its speedup only where an fp8 cell was measured."""
    import table1
    args = table1.parse_args(["--configs", "1.3b-2k", "--precision", "bf16,fp8", "--steps", "3"])
    assert args.precision == ["bf16", "fp8"] and args.attn == list(table1.ATTNS), args
    calls = []

    def fake_run(cell_args, log, timeout_s=600):
        calls.append([str(a) for a in cell_args])
        fp8 = "--precision" in calls[-1]
        tflops = 800.0 if fp8 else 400.0
        records = [{"ms": 10.0, "tokens_per_s": 1e5, "tflops_per_gpu": tflops, "mfu": tflops / 1000}] * 3
        return train_runs.TrainRun(command=["train_gpt"], returncode=0, stdout="", stderr="", records=records,
                                   peak_mem_mib=1024.0, out_of_memory=False, seconds=1.0)

    saved = table1.train_runs.run_train_gpt
    table1.train_runs.run_train_gpt = fake_run
    try:
        bf16 = table1.measure_cell(args, "gpt3-1.3b", 2048, 8, "flash2", WORK)
        fp8 = table1.measure_cell(args, "gpt3-1.3b", 2048, 8, "flash2", WORK, "fp8")
    finally:
        table1.train_runs.run_train_gpt = saved
    assert "--precision" not in calls[0] and calls[1][-2:] == ["--precision", "fp8"], calls
    assert (bf16["precision"], fp8["precision"]) == ("bf16", "fp8") and table1.cell_key(bf16) != table1.cell_key(fp8)
    result = {"device": "GPU", "date": "d", "commit": "c", "command": "x", "batch_tokens": 131072,
              "records": [bf16, fp8]}
    md = table1.markdown(result)
    assert "| FA2 FP8 | FP8 / FA2 |" in md and "| 400 (196) | – (1.38×) | – (1.04×) | 800 | 2.00× |" in md, md
    assert "| gpt3-1.3b | 2048 | flash2 fp8 | 8 |" in md, md
    md = table1.markdown({**result, "records": [bf16]})
    assert "FP8" not in md, md
    try:
        table1.parse_args(["--precision", "fp16"])
    except SystemExit:
        return
    raise AssertionError("--precision fp16 accepted")


def test_bench_long_context_runs_and_records():
    """scripts/bench_long_context.py with a stand-in train_gpt that writes its JSONL log: the run list, the
    record arithmetic (median step time -> model and hardware TFLOP/s) and the results files."""
    import bench_long_context as blc
    import torch_gpt as tg
    runs = blc.parse_runs("train_gpt:gpt3-1.3b:65536:full,torch:gpt3-1.3b:65536,train_gpt:gpt3-1.3b:65536:full:cp4")
    assert runs == [("train_gpt", "gpt3-1.3b", 65536, "full", 1), ("torch", "gpt3-1.3b", 65536, "blocks", 1),
                    ("train_gpt", "gpt3-1.3b", 65536, "full", 4)], runs
    for bad in ("train_gpt:gpt3-1.3b:65536", "torch:gpt3-1.3b:65536:full", "train_gpt:gpt9:1024:none",
                "train_gpt:gpt3-1.3b:64k:none", "train_gpt:gpt3-1.3b:1024:some", "train_gpt:gpt3-1.3b:1024:full:cp",
                "train_gpt:gpt3-1.3b:1024:full:4", "torch:gpt3-1.3b:1024:cp2", "train_gpt:gpt3-1.3b:1024:full:cp0"):
        try:
            blc.parse_runs(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} accepted")
    assert len(blc.default_runs()) == 6 * 4
    fake = os.path.join(WORK, "fake_train_gpt")
    with open(fake, "w") as f:  # 3 steps of 100, 50 and 70 ms; hardware FLOPs 1.25x the model's
        f.write(f"#!{sys.executable}\nimport sys\nif '--log-file' not in sys.argv:\n    sys.exit(0)  # ranks > 0\n"
                "log = sys.argv[sys.argv.index('--log-file') + 1]\n"
                "with open(log, 'w') as f:\n"
                "    for step, (ms, loss) in enumerate([(100.0, 11.0), (50.0, 10.0), (70.0, 9.0)], 1):\n"
                "        f.write('{\"step\": %d, \"loss\": %f, \"ms\": %f, \"tflops_per_gpu\": 4.0, '\n"
                "                '\"hw_tflops_per_gpu\": 5.0}\\n' % (step, loss, ms))\n")
    os.chmod(fake, 0o755)
    shard = os.path.join(WORK, "shard.bin")
    open(shard, "wb").close()
    out = os.path.join(WORK, "blc")
    rc = blc.main(["--runs", "train_gpt:gpt3-1.3b:4096:full", "--train-gpt", fake, "--train-data", shard,
                   "--results-dir", out, "--out", out, "--peak-tflops", "1000", "--timed", "2"])
    assert rc == 0
    [path] = [os.path.join(out, n) for n in os.listdir(out) if n.startswith("long_context_") and n.endswith(".json")]
    [rec] = json.load(open(path))["records"]
    flops = tg.flops_per_sequence(tg.gpt_config("gpt3-1.3b", seq_len=4096), 4096)
    assert rec["status"] == "ok" and rec["step_ms"] == 60.0 and rec["losses"] == [11.0, 10.0, 9.0], rec
    assert abs(rec["tflops_per_gpu"] - flops / 0.06 / 1e12) < 1e-9 * rec["tflops_per_gpu"], rec
    assert abs(rec["hw_tflops_per_gpu"] / rec["tflops_per_gpu"] - 1.25) < 1e-12, rec
    assert os.path.exists(path[:-5] + ".md")
    # --context-parallel 2: two ranks of the stand-in (rank 0 logs); per-GPU TFLOP/s are half the sequence's,
    # "vs 1 GPU" is that over the one-GPU record above (same commit), the exposed times are the timed medians
    with open(fake, "a") as f:
        f.write("with open(log, 'a') as f:\n"
                "    f.write('{\"step\": 4, \"loss\": 8.0, \"ms\": 40.0, \"tflops_per_gpu\": 4.0, '\n"
                "            '\"ring_exposed_ms\": 1.5, \"comm_exposed_ms\": 0.25}\\n')\n")
    rc = blc.main(["--runs", "train_gpt:gpt3-1.3b:4096:full:cp2", "--train-gpt", fake, "--train-data", shard,
                   "--results-dir", out, "--out", out, "--peak-tflops", "1000", "--timed", "2", "--warmup", "2"])
    assert rc == 0
    one, cp = json.load(open(path))["records"]
    assert cp["context_parallel"] == 2 and cp["step_ms"] == 55.0, cp  # median of 70 and 40
    assert abs(cp["tflops_per_gpu"] - flops / 2 / 0.055 / 1e12) < 1e-9 * cp["tflops_per_gpu"], cp
    assert cp["ring_exposed_ms"] == 1.5 and cp["comm_exposed_ms"] == 0.25, cp
    assert "--context-parallel 2" in cp["command"] and cp["command"].startswith("RANK=0..1 "), cp["command"]
    row = [r for r in blc.table_rows([one, cp]) if r[4] == "2 (cp)"][0]
    assert row[11] == f"{cp['tflops_per_gpu'] / one['tflops_per_gpu']:.2f}x" and row[12] == "1.5 / 0.25", row
    # the data: a shard that holds what a step needs is used; a shorter one gives way to random tokens
    import bench_train
    import shard_format
    small = os.path.join(WORK, "small_000000.bin")
    shard_format.write_shard(small, list(range(100)))
    assert bench_train.training_data(small, WORK, 300, need=100) == small
    other = bench_train.training_data(small, WORK, 300, need=101)
    assert other != small and int(shard_format.read_header(other)[2]) == 300, other
    # a train_gpt that stops before allocating: its stderr lines come before its buffered plan in the log
    log = os.path.join(WORK, "oom.log")
    with open(log, "w") as f:
        f.write("$ ./train_gpt ...\nerror: out of GPU memory: the activations ... need 100.41 GiB\n"
                "hint: --recompute full would fit\nmodel        gpt3-1.3b\ngpu          H100\nmfu peak     989.4\n")
    note, oom = blc.failure_note(log)
    assert oom and "--recompute full would fit" in note and "mfu peak" not in note, note


def test_check_vs_torch_curve_bounds():
    """The loss-curve bound widens only at steps where PyTorch's own bf16 run is far from fp32."""
    import check_vs_torch as cvt
    ref = {"losses": [11.0, 7.0, 10.03, 6.95]}
    yard = {"losses": [11.0, 7.01, 9.93, float("nan")]}
    bounds = cvt.curve_bounds(0.1, yard, ref)
    assert bounds[:2] == [0.1, 0.1] and bounds[3] == 0.1, bounds
    assert abs(bounds[2] - 2 * 0.1) < 1e-9, bounds  # twice torch-bf16's 0.1 off
    assert cvt.curve_bounds(0.1, None, ref) == [0.1] * 4


def test_profile_step_joins_helpers_only_to_the_gemm_they_follow():
    import profile_step
    kernels = [("nvjet_sm90_tst_gelu", 1.0, 0), ("matmul_dbias_partial_kernel", 0.25, 0),
               ("globalKernelBgradAB_v2", 0.125, 0), ("flash2_backward_ws_kernel", 5.0, 0),
               ("matmul_dbias_partial_kernel", 0.5, 0), ("qkv_bias_kv_kernel", 0.0625, 0),
               ("nvjet_sm90_tst_NNT", 2.0, 0)]
    launches = profile_step.gemm_launches_of(kernels)
    assert launches == [["nvjet_sm90_tst_gelu", 1.375], ["nvjet_sm90_tst_NNT", 2.0]], launches


# ---- test/run_tests.sh on stand-in programs (TEST_PROGRAMS, TEST_CASE_COUNTS) -----------------------------

RUNNER = os.path.join(ROOT, "test", "run_tests.sh")
GOOD = ["PLAN 2", "PASS a", "SKIP b: not here", "END 1 passed, 0 failed, 1 skipped"]


def run_runner(programs, counts, **env):
    """Runs the runner on `programs` ({name: output lines}, each a shell script printing them; a trailing int
    is its exit status) with `counts` as its case_counts.txt; returns (exit status, output)."""
    folder = tempfile.mkdtemp(dir=WORK, prefix="runner_")
    commands = []
    for name, lines in programs.items():
        status = lines[-1] if lines and isinstance(lines[-1], int) else 0
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines if isinstance(line, str)))
            f.write(f"exit {status}\n")
        os.chmod(path, 0o755)
        commands.append(path)
    with open(os.path.join(folder, "case_counts.txt"), "w") as f:
        f.write("# stand-in counts\n" + "".join(f"{name} {n}\n" for name, n in counts.items()))
    clean = {k: v for k, v in os.environ.items() if k not in ("TEST_ONLY", "TEST_EXCLUDE", "ATTENTION_TEST_SEQ_LENS")}
    run_env = dict(clean, BUILD=os.path.join(folder, "build"), TEST_PROGRAMS="\n".join(commands),
                   TEST_CASE_COUNTS=os.path.join(folder, "case_counts.txt"), **env)
    done = subprocess.run(["bash", RUNNER], cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=60)
    # indented, so that an assertion showing it adds no PASS/FAIL line to this test's own output
    return done.returncode, "\n".join("  | " + line for line in (done.stdout + done.stderr).splitlines())


def expect_failure(out_and_status, *words):
    rc, out = out_and_status
    assert rc == 1, f"the runner passed:\n{out}"
    for word in words:
        assert word in out, f"no {word!r} in:\n{out}"


def test_runner_passes_a_program_that_keeps_the_protocol():
    rc, out = run_runner({"good": GOOD}, {"good": 2})
    assert rc == 0 and out.endswith("1 passed, 0 failed, 1 skipped"), out


def test_runner_fails_a_program_that_reports_fewer_cases_than_planned():
    short = ["PLAN 3", "PASS a", "PASS b", "END 2 passed, 0 failed, 0 skipped"]
    expect_failure(run_runner({"short": short}, {"short": 3}),
                   "FAIL short: reported 2 cases of the 3 it planned", "2 passed, 1 failed, 0 skipped")


def test_runner_fails_a_program_without_an_end_line():
    expect_failure(run_runner({"stopped": ["PLAN 1", "PASS a"]}, {"stopped": 1}),
                   "FAIL stopped: printed no END line", "1 passed, 1 failed, 0 skipped")


def test_runner_fails_a_program_without_a_plan_line():
    expect_failure(run_runner({"unplanned": ["PASS a", "END 1 passed, 0 failed, 0 skipped"]}, {"unplanned": 1}),
                   "FAIL unplanned: printed no PLAN line")


def test_runner_fails_a_crash_without_a_failed_case():
    expect_failure(run_runner({"crash": ["PLAN 1", "PASS a", "END 1 passed, 0 failed, 0 skipped", 3]}, {"crash": 1}),
                   "FAIL crash: exited with status 3 without reporting a failed case")


def test_runner_fails_a_plan_that_disagrees_with_case_counts():
    expect_failure(run_runner({"good": GOOD}, {"good": 3}),
                   "FAIL good: planned 2 cases", "says 3: update", "if the change is intended")
    expect_failure(run_runner({"good": GOOD}, {}), "FAIL good: planned 2 cases", "has no line for it")
    expect_failure(run_runner({"good": GOOD}, {"good": 2, "gone": 5}), "lists gone, which no command of the list runs")


def test_runner_leaves_the_attention_count_alone_with_other_sequence_lengths():
    programs, counts = {"test_gpu_attention": GOOD}, {"test_gpu_attention": 7}
    expect_failure(run_runner(programs, counts), "FAIL test_gpu_attention: planned 2 cases")
    rc, out = run_runner(programs, counts, ATTENTION_TEST_SEQ_LENS="17,300")
    assert rc == 0, out


def test_runner_fails_a_filter_that_selects_nothing_or_is_invalid():
    expect_failure(run_runner({"good": GOOD}, {"good": 2}, TEST_ONLY="nothing_is_named_so"),
                   "FAIL no test program left to run by TEST_ONLY='nothing_is_named_so'")
    expect_failure(run_runner({"good": GOOD}, {"good": 2}, TEST_EXCLUDE="("), "is not a valid")


def write_bench_multigpu_fakes():
    """Stand-ins for train_gpt and the Python that runs torch_gpt.py, for bench_multigpu.py bench; returns
    their paths."""
    fake_gpt, fake_python = os.path.join(WORK, "fake_train_gpt_mg"), os.path.join(WORK, "fake_python_mg")
    # TFLOP/s per GPU: alone 600, 596, 598, 590 on GPUs 0-3; N GPUs 597 (ZeRO 0) and 594 (ZeRO 1), ZeRO 1
    # on 4: 580. The stand-in fails unless its batch is 131072 tokens per GPU.
    write_fake(fake_gpt, "import json, os, sys\na = sys.argv\nw = int(os.environ.get('WORLD_SIZE', '1'))\n"
               "assert int(a[a.index('--total-batch-tokens') + 1]) == 131072 * w\n"
               "z = a[a.index('--zero') + 1] if '--zero' in a else '0'\n"
               "alone = [600.0, 596.0, 598.0, 590.0][int(os.environ['CUDA_VISIBLE_DEVICES'])] if w == 1 else 0\n"
               "t = alone if w == 1 else (597.0 if z == '0' else (580.0 if w == 4 else 594.0))\n"
               "if '--log-file' in a:\n"
               "    with open(a[a.index('--log-file') + 1], 'w') as f:\n"
               "        for s in range(1, 7):\n"
               "            r = {'step': s, 'loss': 9.0, 'ms': 100.0, 'tokens_per_s': 1.0, 'tflops_per_gpu': t, "
               "'mfu': t / 1000}\n"
               "            if w > 1: r['comm_exposed_ms'] = 1.5 * w\n"
               "            f.write(json.dumps(r) + '\\n')\n")
    # PyTorch: 2000 ms per 131072 tokens on one GPU; N GPUs, 131072 each: 2000 / 0.97 ms
    write_fake(fake_python, "import json, sys\na = sys.argv\n"
               "w = int(a[a.index('--nproc-per-node') + 1]) if '--nproc-per-node' in a else 1\n"
               "tokens = int(a[a.index('--total-batch-tokens') + 1])\n"
               "ms = 2000.0 * tokens / 131072 / w / (0.97 if w > 1 else 1.0)\n"
               "json.dump({'status': 'ok', 'torch': 'x', 'step_ms': [ms] * 6}, "
               "open(a[a.index('--result-json') + 1], 'w'))\n")
    return fake_gpt, fake_python


def test_bench_multigpu_runs_ours_and_torch_ddp_at_each_gpu_count():
    """bench_multigpu.py bench --gpus 2,4 with stand-in children: train_gpt alone on each of GPUs 0-3 (at once,
    CUDA_VISIBLE_DEVICES), on 2 and 4 GPUs (ZeRO 0 and 1, torchrun-style variables), and torch_gpt.py on 1 GPU
    and under torch.distributed.run on 2 and 4, each with 131072 tokens per GPU per step; the per-GPU ratios
    against each implementation's own one-GPU run on GPU 0 and train_gpt's against the slowest GPU alone,
    train_gpt's exposed communication in the table, and PASS/FAIL against --min-ratio (the stand-in ZeRO-1 at
    4 GPUs is below it: exit 1)."""
    import bench_multigpu
    fake_gpt, fake_python = write_bench_multigpu_fakes()
    out = os.path.join(WORK, "bench_mg")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # its PASS/FAIL lines are the bench's, not this test's
        code = bench_multigpu.main(["bench", "--out-dir", out, "--gpus", "2,4", "--train-gpt", fake_gpt, "--python",
                                    fake_python, "--results", out, "--train-data", "unused.bin"])
    assert code == 1, "ZeRO-1 at 4 GPUs is below 0.99 of one GPU: the bench must fail"
    verdicts = [line for line in printed.getvalue().splitlines() if line.startswith(("PASS", "FAIL"))]
    assert len(verdicts) == 4 and verdicts[-1].startswith("FAIL bench_4gpu_zero1: per-GPU TFLOP/s 0.9667") and \
        "PyTorch DDP: 0.97" in verdicts[-1] and f"{round(580 / 590, 4)} of the slowest GPU alone" in verdicts[-1], \
        verdicts
    [path] = [os.path.join(out, n) for n in os.listdir(out) if n.startswith("multigpu_") and n.endswith(".json")]
    records = {(r["impl"], r["gpus"], r["zero"], r.get("gpu", 0)): r for r in json.load(open(path))["records"]}
    assert set(records) == {("train_gpt", 1, 0, g) for g in range(4)} | {
        ("train_gpt", 2, 0, 0), ("train_gpt", 2, 1, 0), ("train_gpt", 4, 0, 0), ("train_gpt", 4, 1, 0),
        ("torch", 1, 0, 0), ("torch", 2, 0, 0), ("torch", 4, 0, 0)}, sorted(records)
    two, four = records["train_gpt", 2, 0, 0], records["train_gpt", 4, 1, 0]
    assert two["per_gpu_vs_1gpu"] == 0.995 and two["per_gpu_vs_slowest_1gpu"] == round(597 / 596, 4), two
    assert four["per_gpu_vs_1gpu"] == round(580 / 600, 4) and four["per_gpu_vs_slowest_1gpu"] == round(580 / 590, 4)
    assert records["torch", 4, 0, 0]["per_gpu_vs_1gpu"] == 0.97 and records["torch", 1, 0, 0]["per_gpu_vs_1gpu"] == 1.0
    assert records["train_gpt", 4, 0, 0]["comm_exposed_ms"] == 6.0 and \
        "comm_exposed_ms" not in records["train_gpt", 1, 0, 0]
    md = open(path[:-5] + ".md").read()
    assert "| train_gpt | 4 | all | 1 |" in md and "| torch | 4 | all | 0 |" in md and "| train_gpt | 1 | 3 | 0 |" \
        in md and "comm exposed ms" in md, md


def test_bench_multigpu_zero_selects_the_stages_it_runs():
    """bench --zero 1 runs train_gpt's multi-GPU side with ZeRO-1 only (no ZeRO 0 record, no ZeRO 0 verdict);
    --zero with anything but 0 and 1 is a usage error (exit 2) that names what it takes."""
    import bench_multigpu
    fake_gpt, fake_python = write_bench_multigpu_fakes()
    out = os.path.join(WORK, "bench_mg_zero1")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = bench_multigpu.main(["bench", "--out-dir", out, "--gpus", "2", "--zero", "1", "--train-gpt", fake_gpt,
                                    "--python", fake_python, "--results", out, "--train-data", "unused.bin"])
    assert code == 0, printed.getvalue()[-2000:]
    verdicts = [line.split(":")[0] for line in printed.getvalue().splitlines() if line.startswith(("PASS", "FAIL"))]
    assert verdicts == ["PASS bench_2gpu_zero1"], verdicts
    [path] = [os.path.join(out, n) for n in os.listdir(out) if n.startswith("multigpu_") and n.endswith(".json")]
    keys = {(r["impl"], r["gpus"], r["zero"], r.get("gpu", 0)) for r in json.load(open(path))["records"]}
    assert keys == {("train_gpt", 1, 0, 0), ("train_gpt", 1, 0, 1), ("train_gpt", 2, 1, 0), ("torch", 1, 0, 0),
                    ("torch", 2, 0, 0)}, sorted(keys)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            bench_multigpu.main(["bench", "--out-dir", out, "--zero", "2"])
            raise AssertionError("--zero 2 was accepted")
        except SystemExit as e:
            assert e.code == 2, e.code
    assert "give ZeRO stages 0 and/or 1" in err.getvalue(), err.getvalue()


def test_torch_gpt_data_parallel_matches_one_process():
    """torch_gpt.py bench under torchrun (DistributedDataParallel, gloo on the CPU, 2 ranks, 2 micro steps
    each under no_sync but the last) gives the losses of one process accumulating the same 4 micro
    batches: the same sequences per step (each rank reads its slice of every chunk, as train_gpt's
    ranks do), averaged in another order (fp32: 1e-5 relative covers the reordered sums)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise harness.Skip("needs PyTorch (test/requirements.txt)")
    import numpy as np
    import shard_format
    shard = os.path.join(WORK, "ddp_shard.bin")
    shard_format.write_shard(shard, np.random.default_rng().integers(0, 50257, size=6000))
    args = ["bench", "--device", "cpu", "--compile", "none", "--dtype", "fp32", "--model", "gpt2-124m", "--layers",
            "2", "--hidden", "64", "--heads", "1", "--seq-len", "32", "--batch-size", "2", "--total-batch-tokens",
            "256", "--steps", "3", "--train-data", shard]
    script = os.path.join(ROOT, "scripts", "torch_gpt.py")
    one, two = os.path.join(WORK, "ddp_one.json"), os.path.join(WORK, "ddp_two.json")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, script, *args, "--result-json", one], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                        str(train_runs.free_port()), script, *args, "--result-json", two],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "x 2 ranks (DDP), 2 micro steps per step" in r.stdout, r.stdout
    a, b = json.load(open(one)), json.load(open(two))
    assert (a["world"], a["grad_accum"], b["world"], b["grad_accum"]) == (1, 4, 2, 2), (a, b)
    for x, y in zip(a["losses"], b["losses"]):
        assert abs(x - y) <= 1e-5 * abs(x), (a["losses"], b["losses"])
    assert a["losses"][0] != a["losses"][2], "the steps did not train"



# ---- bench_generate.py: its arguments, train_gpt's lines it reads, its bounds, its refusal ----

SPEED_LINE = ("speed        prefill 4 x 16 tokens in 12.5 ms; 4 x 256 new tokens in 0.300 s: 3413 tokens/s (853 per "
              "sequence), 1.172 ms per step; steady 1.100 ms per step, 3636 tokens/s (tokens 3..256, GPU time)")


def _assert_usage_errors(parse_args, cases):
    """Each (arguments, words) of cases: parse_args exits 2 with the words in its message."""
    for bad, why in cases:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                parse_args(bad)
                raise AssertionError(f"{bad} accepted")
            except SystemExit as e:
                assert e.code == 2, (bad, e.code)
        assert why in err.getvalue(), (bad, err.getvalue())


def test_bench_generate_arguments():
    import bench_generate
    a = bench_generate.parse_args(["--models", "gpt2-124m,gpt3-1.3b", "--batches", "1, 4", "--prompts", "16,2k"])
    assert a.models == ["gpt2-124m", "gpt3-1.3b"] and a.batches == [1, 4] and a.prompts == [16, 2048], vars(a)
    d = bench_generate.parse_args([])
    assert d.models == ["gpt2-124m", "gpt3-1.3b", "gpt3-2.7b"] and d.batches == [1, 4, 16, 64], vars(d)
    assert d.prompts == [16, 2048] and d.tokens == 256, vars(d)
    _assert_usage_errors(bench_generate.parse_args, ((["--models", "gpt9"], "unknown model"),
                                                     (["--batches", "0"], "positive"), (["--prompts", "x"], "invalid"),
                                                     (["--tokens", "2"], "at least 3")))


def test_bench_generate_baseline_arguments():
    import bench_generate
    base = os.path.join(WORK, "train_gpt_base_args")
    with open(base, "w") as f:
        f.write("#!/bin/sh\n")
    a = bench_generate.parse_args(["--baseline", base, "--no-hf"])
    assert a.baseline == os.path.abspath(base) and a.rounds == 3 and a.no_hf, vars(a)
    assert bench_generate.parse_args([]).rounds == 1 and not bench_generate.parse_args([]).no_hf
    assert bench_generate.parse_args(["--baseline", base, "--rounds", "5"]).rounds == 5
    _assert_usage_errors(bench_generate.parse_args, ((["--rounds", "0"], "at least 1"),
                                                     (["--baseline", base + "_missing"], "no file")))


def _stand_in_train_gpt(name, steady_ms, tokens, order_log):
    """A script that answers like `train_gpt --generate` (speed, memory, tokens) and notes its turn."""
    path = os.path.join(WORK, name)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho {name} >> {order_log}\necho '{SPEED_LINE.replace('1.100', steady_ms)}'\n"
                f"echo 'memory       the memory in use grew by 10.0 MiB at the peak'\n"
                f"echo 'tokens       {tokens}'\n")
    os.chmod(path, 0o755)
    return path


def test_bench_generate_times_builds_in_turns():
    import bench_generate
    out, order_log = os.path.join(WORK, "bench_generate_ab"), os.path.join(WORK, "ab_order.txt")
    os.makedirs(out, exist_ok=True)
    ours = _stand_in_train_gpt("ours_build", "1.000", "5 6 7", order_log)
    base = _stand_in_train_gpt("base_build", "1.250", "5 6 7", order_log)
    other = _stand_in_train_gpt("other_build", "1.100", "5 6 8", order_log)
    args = bench_generate.parse_args(["--baseline", base, "--no-hf", "--out", out, "--train-gpt", ours,
                                      "--timeout", "30"])
    runs = bench_generate.time_binaries(args, [ours, base], "w.bin", "p.txt", 4, 16, "row")
    with open(order_log) as f:  # one untimed run of the build that goes last, then both in turns
        order = f.read().split()
    assert order == ["base_build"] + ["ours_build", "base_build"] * 3, order
    assert [len(r) for r in runs] == [3, 3] and runs[0][0]["tokens_digest"], runs
    o, b = bench_generate.summarize_runs(runs[0]), bench_generate.summarize_runs(runs[1])
    assert o["ms_per_token"] == 1.0 and b["ms_per_token"] == 1.25 and o["runs_ms"] == [1.0] * 3, (o, b)
    assert abs(o["tokens_per_s"] - 4000.0) < 1e-9, o
    assert bench_generate.same_tokens(*runs) is True
    rec = {"model": "gpt2-124m", "prompt": 16, "batch": 4, "weight_bound_ms": 0.5, "kv_bound_ms": 0.6, "ours": o,
           "baseline": b, "same_tokens": True}
    line = bench_generate.table([rec]).splitlines()[1]
    assert "1.25x" in line and " yes " in line and "1.250" in line, line
    # a build that prints other tokens, and one that fails, are reported as such
    runs2 = bench_generate.time_binaries(args, [ours, other], "w.bin", "p.txt", 4, 16, "row2")
    assert bench_generate.same_tokens(*runs2) is False
    rec2 = dict(rec, baseline=bench_generate.summarize_runs(runs2[1]), same_tokens=False)
    assert " NO " in bench_generate.table([rec2]).splitlines()[1]
    failing = os.path.join(WORK, "failing_build")
    with open(failing, "w") as f:
        f.write("#!/bin/sh\necho 'error: no CUDA GPU found' >&2\nexit 1\n")
    os.chmod(failing, 0o755)
    runs3 = bench_generate.time_binaries(args, [ours, failing], "w.bin", "p.txt", 4, 16, "row3")
    failed = bench_generate.summarize_runs(runs3[1])
    assert "error" in failed and "no CUDA GPU" in failed["error"], failed
    assert bench_generate.same_tokens(*runs3) is None


def test_bench_generate_reads_train_gpt_lines_and_bounds():
    import bench_generate
    import torch_gpt as tg
    text = ("model        from w.bin: ...\n" + SPEED_LINE + "\nmemory       weights 237.0 MiB, KV cache 72.0 MiB (4 x "
            "271 positions), decode activations 3.1 MiB, prefill 5.0 MiB (freed after the prompt); the GPU's memory "
            "in use grew by 812.4 MiB at the peak (...)\n")
    r = bench_generate.parse_train_gpt_output(text)
    assert r["prefill_ms"] == 12.5 and r["ms_per_token"] == 1.1 and r["B"] == 4 and r["tokens"] == 256, r
    assert abs(r["tokens_per_s"] - 4000 / 1.1) < 1e-6 and abs(r["wall_ms_per_token"] - 300 / 256) < 1e-9, r
    assert r["memory_mib"] == 812.4, r
    no_steady = SPEED_LINE.split("; steady")[0]
    assert bench_generate.parse_train_gpt_output(no_steady)["ms_per_token"] == 300 / 256
    assert bench_generate.parse_train_gpt_output("error: no CUDA GPU found") is None
    cfg = tg.gpt_config("gpt2-124m", seq_len=1024)
    # 124,475,904 parameters (data/gpt_config.h's count), wpe's 1024 rows less the one a step reads
    assert bench_generate.weight_read_bytes(cfg) == 2 * (124475904 - 1024 * 768 + 768)
    assert bench_generate.kv_read_bytes(cfg, 2, 100) == 2 * 2 * 2 * 100 * 12 * 12 * 64
    table = bench_generate.table([{"model": "gpt2-124m", "prompt": 16, "batch": 4, "weight_bound_ms": 0.55,
                                   "kv_bound_ms": 0.6, "ours": r, "hf": {"ms_per_token": 2.2, "tokens_per_s": 1818}},
                                  {"model": "gpt2-124m", "prompt": 16, "batch": 64, "weight_bound_ms": 0.55,
                                   "kv_bound_ms": 0.9, "ours": {"error": "exit 1"}, "hf": {"error": "oom"}}])
    lines = table.splitlines()
    assert len(lines) == 3 and "2.00x" in lines[1] and "50%" in lines[1] and lines[2].count(" - ") >= 4, table


def test_bench_generate_fails_clearly_without_torch_or_transformers():
    env = dict(os.environ, PYTHONPATH="")
    blocker = os.path.join(WORK, "no_torch")
    os.makedirs(blocker, exist_ok=True)
    with open(os.path.join(blocker, "sitecustomize.py"), "w") as f:  # makes `import transformers` fail
        f.write("import sys\nimport importlib.abc\n"
                "class _Block(importlib.abc.MetaPathFinder):\n"
                "    def find_spec(self, name, path=None, target=None):\n"
                "        if name.split('.')[0] == 'transformers':\n"
                "            raise ModuleNotFoundError(name)\n        return None\n"
                "sys.meta_path.insert(0, _Block())\n")
    env["PYTHONPATH"] = blocker
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_generate.py"), "--models", "gpt2-124m"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "needs transformers" in r.stderr, (r.returncode, r.stderr)


# ---- decode_trace.py: kernel instances, steps and per-kind times from a stand-in trace ----

def _write_decode_trace(path, steps, swap=None):
    """A trace of `steps` steps of one layer: A, E, Q (2 blocks), S (2: one empty split 's'), C, P, F, R, N, D,
    each kernel 10 us long after the previous one's end plus 1 us of wait; blocks start 3 us before ready.
    swap (tag, seconds): that kind's kernels last this much longer (a planted change the summary must show)."""
    blocks = {"Q": 2, "S": 2}
    t, lines = 1_000_000, ["tag,block,smid,aux,start,ready,end"]
    for _ in range(steps):
        for tag in "AEQSCPFRND":
            ready = t + 1000
            end = ready + 10_000 + (swap[1] * 1000 if swap and swap[0] == tag else 0)
            for b in range(blocks.get(tag, 1)):
                # the second block ends 2 us early: its drain shows in the median end
                name = "s" if (tag, b) == ("S", 1) else tag
                lines.append(f"{name},{b},{b},0,{ready - 3000},{ready + 100 * b},{end - 2000 * b}")
            t = end
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def test_decode_trace_instances_steps_and_kinds():
    import decode_trace
    path = os.path.join(WORK, "trace.csv")
    _write_decode_trace(path, 3)
    inst = decode_trace.kernel_instances(decode_trace.read_records(path))
    assert len(inst) == 30 and [i["tag"] for i in inst[:10]] == list("AEQSCPFRND"), [i["tag"] for i in inst]
    assert inst[2]["blocks"] == 2 and inst[3]["blocks"] == 2, inst[2:4]  # the empty split counts as a split
    steps = decode_trace.split_steps(inst)
    assert [len(s) for s in steps] == [10, 10, 10], [len(s) for s in steps]
    summ = decode_trace.kind_summary(steps)
    q = summ["Q"]  # each kernel adds 1 us of wait + 10 us; the second block ends 2 us early
    assert q["count"] == 1 and abs(q["adds_us"] - 11.0) < 1e-9 and abs(q["wait"] - 1.0) < 1e-9, q
    assert abs(q["busy"] - 10.0) < 1e-9 and abs(q["ramp"] - 0.05) < 1e-9 and abs(q["drain"] - 1.0) < 1e-9, q
    assert "A" not in summ and abs(sum(s["adds_us"] for s in summ.values()) - 99.0) < 1e-9, summ
    out = io.StringIO()
    decode_trace.print_report(steps, summ, out)
    assert "qkv" in out.getvalue() and "99.0" in out.getvalue(), out.getvalue()
    # planted: fc 5 us longer in every step moves exactly fc's share
    _write_decode_trace(path, 3, swap=("F", 5))
    planted = decode_trace.kind_summary(decode_trace.split_steps(
        decode_trace.kernel_instances(decode_trace.read_records(path))))
    assert abs(planted["F"]["adds_us"] - 16.0) < 1e-9 and abs(planted["Q"]["adds_us"] - 11.0) < 1e-9, planted
    # not a trace, an unknown tag
    for text, why in (("a,b\n1,2\n", "not a decode trace"), ("tag,block,smid,aux,start,ready,end\nZ,0,0,0,1,2,3\n",
                                                            "unknown kernel tag")):
        with open(path, "w") as f:
            f.write(text)
        try:
            decode_trace.read_records(path)
            raise AssertionError(f"{text!r} accepted")
        except SystemExit as e:
            assert why in str(e), e


if __name__ == "__main__":
    try:
        harness.run_module(globals())
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
