"""GRPO speed as the work grows: Kiln against TRL's GRPOTrainer, cell by cell, on the CPU. Imports no Django.

Cells: model (`tiny`: the shipped tiny model; `q25m`: a random-weight Qwen3 of 25.7 M parameters,
hidden 512, 8 layers, the tiny tokenizer) x group size (8, 32) x completion length (32, 256).
Workload on every side: `--prompts` prompts x group completions of exactly `length` sampled tokens
a round, LoRA r 8 / alpha 16 on q, k, v, o, KL coefficient 0.1 against the base model, AdamW.
Sides (each measurement is a fresh process, the sides alternate, the order rotates per repeat):
- kiln: the project's sampler, then `train_grpo` on the sampled token ids themselves
  (behavior_policy "recorded": the provenance's input_token_ids are the sequence and exactly the
  sampled tokens are trained; nothing is decoded and re-tokenized, no end token is added);
- trl: TRL tuned (fp32, no gradient checkpointing), the peer to beat;
- trl-default: TRL with its GRPOConfig defaults (bf16 autocast, gradient checkpointing).
TRL runs in its own virtual environment (`bash benchmarks/trl_env.sh`). Every phase is measured
per round the same way on every side: the median over a process's timed rounds, then the median
over repeats. Before the timed rounds each process runs one warm-up round of the same batch at
min(length, 32) tokens. Kiln takes one optimizer step per group, TRL one per round.

FLOP/s are useful FLOPs (benchmarks/bench_support.py: decoder matmuls, LoRA, causal attention,
the LM head on the scored positions; the backward with frozen base weights; recomputation not
counted) over each side's own token layout (Kiln: the prompt once per group; TRL: every
completion with its padded prompt), as a share of the fp32 matmul peak measured here first.

    bash benchmarks/trl_env.sh
    .venv/bin/python benchmarks/grpo_scaling.py [--cells tiny:8:32,q25m:32:256] [--repeats 3] [--quick]

Prints one table; never asserts speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import bench_support as bench  # noqa: E402

PROMPTS = [
    "What is 47 + 38? Reply with just the number.",
    "What is 91 - 15? Reply with just the number.",
]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL_CELLS = [f"{m}:{g}:{n}" for m in bench.MODELS for g in (8, 32) for n in (32, 256)]
PHASES = ["generation_ms", "reference_forward_ms", "policy_forward_ms", "backward_ms", "optimizer_ms"]
# Peak anonymous memory is the goal's figure; peak RSS also counts touched library and weight-file
# pages, which depend on the page cache (benchmarks/anon_memory.py).
MEMORY = ["peak_anon_mib", "peak_rss_mib"]
MEMORY_LABELS = {"peak_anon_mib": "peak anon MiB", "peak_rss_mib": "peak RSS MiB"}
SIDES = ["kiln", "trl", "trl-default"]
GOAL_RATIO = 0.45  # every phase at most this share of tuned TRL's time (the "half, with margin")
GOAL_PEAK = 0.75  # forwards and backward on the larger model at least this share of the matmul peak
DEFAULT_TRL_PYTHON = Path(os.environ.get("KILN_TRL_VENV", "/tmp/kiln-trl-venv")) / "bin" / "python"


# ---- the Kiln measurement (runs in its own process: `--kiln-worker JSON`) --------------------


def kiln_worker(cfg: dict) -> dict:
    from anon_memory import AnonPeak

    anon = AnonPeak()  # first: both sides count from their start
    import torch

    torch.set_num_threads(cfg["threads"])
    sys.path.insert(0, str(REPO))
    from core.contracts.grpo_config import GrpoConfig
    from core.contracts.provenance import build_rollout_provenance
    from gpu_runtime.grpo.trainer import TrainRequest, train_grpo
    from gpu_runtime.model_loading import load_model
    from gpu_runtime.sample_types import SampleRequest
    from gpu_runtime.sampler import Sampler
    from gpu_runtime.sampling import SamplingParams

    prompts, group = cfg["prompts"], cfg["group"]
    peak = bench.matmul_peak(cfg["threads"], size=2048, repeats=4)  # this process's own peak, under today's load
    loaded = load_model(cfg["model"], device="cpu")
    sampler = Sampler(loaded)

    def sample(seed: int, tokens: int):
        requests = [
            SampleRequest(
                messages=[{"role": "user", "content": prompt}],
                sampling=SamplingParams(temperature=1.0, max_tokens=tokens),
                seed=seed * 1000 + p * group + i,
                enable_thinking=False,
                ignore_eos=True,
            )
            for p, prompt in enumerate(prompts)
            for i in range(group)
        ]
        started = time.perf_counter()
        results = sampler.generate(requests)
        ms = (time.perf_counter() - started) * 1000
        groups = []
        for p, prompt in enumerate(prompts):
            messages = [{"role": "user", "content": prompt}]
            chunk = results[p * group : (p + 1) * group]
            completions = [
                {
                    "text": r.text,
                    "reward": sum(ch.isdigit() for ch in r.text) / max(1, len(r.text)) + 1e-3 * i,
                    "provenance": build_rollout_provenance(r, prompt_messages=messages),
                }
                for i, r in enumerate(chunk)
            ]
            groups.append({"messages": messages, "completions": completions})
        return results, groups, ms

    config = GrpoConfig.from_dict(
        {
            "optimizer": {"kind": "adam_w"},
            "learning_rate": 1e-5,
            "lora_rank": 8,
            "lora_alpha": 16,
            "kl_coeff": 0.1,
            "dynamic_sampling": False,
            "behavior_policy": "recorded",
            "seed": 0,
        }
    )
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:

        def train(name: str, groups: list[dict]):
            request = TrainRequest(
                model_dir=Path(cfg["model"]),
                groups=groups,
                config=config,
                output_dir=Path(tmp) / name,
                adapter_name=name,
                device="cpu",
                # The sampler's records are this process's own: skip the setup-time replay of the
                # behavior log-probs (outside the timed phases either way).
                replay_recorded_behavior=False,
                shared_base=loaded.shared_base,  # as in the GPU worker: the sampler's weights, no second copy
            )
            return train_grpo(request, on_progress=lambda p: None, should_stop=lambda: False)

        _, warm_groups, _ = sample(999, cfg["warmup_tokens"])
        train("warmup", warm_groups)
        for r in range(cfg["rounds"]):
            results, groups, generation_ms = sample(r, cfg["new_tokens"])
            assert all(len(x.completion_token_ids) == cfg["new_tokens"] for x in results)
            result = train(f"round{r}", groups)
            timings = result.receipt["phase_timings"]
            provenance = result.receipt["runtime"]["execution_provenance"]
            rounds.append(
                {
                    "generation_ms": generation_ms,
                    **{k: timings[k] for k in PHASES[1:]},
                    "optimizer_steps": result.final_step,
                    "trained_tokens": sum(
                        s == "sampled" for x in results for s in x.token_sources
                    ),
                    "prompt_lengths": [len(x.prompt_token_ids) for x in results],
                    "forward_path": provenance.get("forward_path"),
                    "reference_path": provenance.get("reference_path"),
                    "fallbacks": result.receipt.get("fallbacks"),
                }
            )
        # Memory is read before the profiled round: the profiler keeps its own records, which
        # would otherwise count as this side's peak.
        peak_rss_mib, peak_anon_mib = bench.peak_rss_mib(), anon.stop()
        profile = None
        if cfg.get("profile"):  # one more round, untimed, under the profiler
            (_, groups, _), sampling = profiled(lambda: sample(cfg["rounds"], cfg["new_tokens"]))
            _, training = profiled(lambda: train("profiled", groups))
            profile = {"sampling": sampling, "training": training}
    return {
        "rounds": rounds,
        "peak_rss_mib": peak_rss_mib,
        "peak_anon_mib": peak_anon_mib,
        "peak_flops": peak,
        "profile": profile,
        "threads": torch.get_num_threads(),
        "sampler_path": sampler.forward_path,
    }


def profiled(fn):
    """Run `fn` under torch.profiler; (its result, the top operators by self CPU time as text).
    The profiler slows small operators down, so its figures explain, the timed rounds measure."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = fn()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=48)
    return result, table


# ---- running one measurement in a fresh process ---------------------------------------------


def run_side(side: str, model_dir: Path, group: int, length: int, args, profile: bool = False) -> dict:
    cfg = {
        "model": str(model_dir),
        "prompts": PROMPTS[: args.prompts],
        "group": group,
        "new_tokens": length,
        "rounds": args.rounds,
        "threads": args.threads,
        "warmup_tokens": min(length, 32),
        "targets": TARGETS,
        "mode": "tuned" if side == "trl" else "default",
        "profile": profile,
    }
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    if side == "kiln":
        command = [sys.executable, str(Path(__file__).resolve()), "--kiln-worker", json.dumps(cfg)]
        marker = "KILN_RESULT "
    else:
        command = [str(args.trl_python), str(HERE / "trl_grpo_worker.py"), json.dumps(cfg)]
        marker = "TRL_RESULT "
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env, cwd=REPO)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(marker)), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{side} run failed (rc {proc.returncode}): {proc.stderr[-3000:]}")
    data = json.loads(line.removeprefix(marker))
    data["process_s"] = time.perf_counter() - started
    return data


def summarise(side: str, data: dict, shape: bench.Shape, group: int, length: int) -> dict:
    """Per-phase medians over the process's rounds, and the useful FLOPs of each phase a round."""
    rounds = data["rounds"]
    row = {k: statistics.median(r.get(k, 0.0) for r in rounds) for k in PHASES}
    row["trained_tokens"] = rounds[0]["trained_tokens"]
    row["peak_rss_mib"] = data["peak_rss_mib"]
    row["peak_anon_mib"] = data["peak_anon_mib"]
    if side == "kiln":
        lengths = rounds[0]["prompt_lengths"]
        shared = {rounds[0].get("forward_path"), rounds[0].get("reference_path")}
        row["paths"] = f"forward {rounds[0].get('forward_path')}, reference {rounds[0].get('reference_path')}"
        groups = [lengths[i] for i in range(0, len(lengths), group)]
        # Both forwards run each group's prompt once and the completions against its keys/values.
        fwd_rows = [(p, 0, 1) for p in groups] + [(length, p, length - 1) for p in groups for _ in range(group)]
        if not shared & {"lean", "shared_prefix"} and None not in shared:
            fwd_rows = [(p + length, 0, length) for p in lengths]
        gen = bench.generation_flops(shape, lengths, length)
    else:
        r0 = rounds[0]
        width = r0["padded_prompt"]
        fwd_rows = [(width + r0["completion_width"], 0, r0["completion_width"])] * r0["sequences"]
        gen = bench.generation_flops(shape, [width] * r0["sequences"], length)
        row["paths"] = f"TRL {data['trl']} ({data['mode']}), calls over the timed rounds {data['calls']}"
    flops = {
        "generation_ms": gen,
        "reference_forward_ms": bench.forward_flops(shape, fwd_rows),
        "policy_forward_ms": bench.forward_flops(shape, fwd_rows),
        "backward_ms": bench.backward_flops(shape, fwd_rows),
    }
    if side == "kiln" and rounds[0].get("reference_path") == "recorded_behavior":
        # Sampled from the reference itself at temperature 1: the trainer reused the recorded
        # log-probs and ran no reference forward, so that phase has no FLOPs and no peak share.
        flops["reference_forward_ms"] = 0
    row["peak_flops"] = data["peak_flops"]
    # Each process's achieved FLOP/s against the matmul peak it measured itself just before.
    row["share"] = {k: f / (row[k] / 1000) / data["peak_flops"] for k, f in flops.items() if row[k] and f}
    return row


def median_rows(rows: list[dict]) -> dict:
    out = dict(rows[0])
    for key in PHASES + MEMORY + ["peak_flops"]:
        out[key] = statistics.median(r[key] for r in rows)
    out["share"] = {k: statistics.median(r["share"][k] for r in rows) for k in rows[0]["share"]
                    if all(k in r["share"] for r in rows)}
    out["repeats"] = len(rows)
    return out


# ---- the table ----------------------------------------------------------------------------


def floors_at_peak(kiln: dict, trl: dict) -> dict[str, float]:
    """Per phase with FLOPs: Kiln's time at 100 % of its own matmul peak over TRL's time, i.e. the
    best ratio that running Kiln's work faster could reach. Where it exceeds the goal, only doing
    less work (not faster work) can meet it in this cell."""
    return {
        p.removesuffix("_ms"): kiln["share"][p] * kiln[p] / trl[p]
        for p in PHASES
        if p in kiln["share"] and trl[p]
    }


def print_table(results: dict, peak: float, sides: list[str], args) -> list[str]:
    lines = []

    def emit(text: str = "") -> None:
        lines.append(text)
        print(text)

    ratio_sides = [s for s in sides if s != "kiln"]
    head = f"{'cell (model g len)':18} {'phase':16}" + "".join(f"{s + ' ms':>15}" for s in sides)
    head += "".join(f"{'kiln/' + s:>17}" for s in ratio_sides)
    head += "".join(f"{s + ' %pk':>17}" for s in sides)
    emit(head)
    emit("-" * len(head))
    verdicts = []
    for cell, per_side in results.items():
        model = cell.split(":")[0]
        label = cell.replace(":", " ")
        for phase in PHASES + MEMORY:
            name = MEMORY_LABELS.get(phase, phase.removesuffix("_ms"))
            text = f"{label:18} {name:16}"
            text += "".join(
                f"{per_side[s][phase]:>15.1f}" if s in per_side else f"{'-':>15}" for s in sides
            )
            for s in ratio_sides:
                ok = s in per_side and per_side[s][phase] and "kiln" in per_side
                text += f"{per_side['kiln'][phase] / per_side[s][phase]:>17.2f}" if ok else f"{'-':>17}"
            for s in sides:
                share = per_side.get(s, {}).get("share", {}).get(phase)
                text += f"{100 * share:>16.0f}%" if share else f"{'':>17}"
            emit(text)
            label = ""
        tokens = " / ".join(f"{s} {per_side[s]['trained_tokens']}" for s in sides if s in per_side)
        emit(f"{'':18} {'tokens trained':16} {tokens}")
        if "kiln" in per_side and "trl" in per_side:
            worst = max((per_side["kiln"][p] / per_side["trl"][p], p) for p in PHASES if per_side["trl"][p])
            share = per_side["kiln"]["share"]
            kiln_peak = {
                p.removesuffix("_ms"): share[p]
                for p in ("reference_forward_ms", "policy_forward_ms", "backward_ms")
                if p in share  # not a reference forward that did not run
            }
            ratio_ok = worst[0] <= GOAL_RATIO
            memory_ok = per_side["kiln"]["peak_anon_mib"] <= per_side["trl"]["peak_anon_mib"]
            verdict = (
                f"{cell}: worst phase {worst[1].removesuffix('_ms')} {worst[0]:.2f} of tuned TRL "
                f"({'meets' if ratio_ok else 'misses'} <= {GOAL_RATIO}); peak anonymous memory "
                f"{'no worse than' if memory_ok else 'above'} TRL's"
            )
            if model == "q25m":
                low = min(kiln_peak.values())
                verdict += (
                    f"; Kiln {', '.join(f'{k} {100 * v:.0f}%' for k, v in kiln_peak.items())} "
                    f"of peak ({'meets' if low >= GOAL_PEAK else 'misses'} >= {100 * GOAL_PEAK:.0f}%)"
                )
            floors = floors_at_peak(per_side["kiln"], per_side["trl"])
            if not ratio_ok and floors:
                verdict += "; at 100% of its matmul peak Kiln would be " + ", ".join(
                    f"{k} {v:.2f}" for k, v in floors.items()
                ) + " of TRL"
            verdicts.append(verdict)
        emit()
    peaks = [r["peak_flops"] for per_side in results.values() for r in per_side.values()]
    emit(
        f"fp32 matmul peak (torch.matmul 3072^2, {args.threads} thread(s)): {peak / 1e9:.1f} GFLOP/s at the start; "
        f"each process measures its own (2048^2) before its work: {min(peaks) / 1e9:.1f}-{max(peaks) / 1e9:.1f} GFLOP/s "
        "(medians per cell and side); the %pk columns use each process's own"
    )
    emit(
        f"{args.prompts} prompt(s) x group completions a round; {args.rounds} timed round(s) per process after "
        f"a warm-up round; medians of {args.repeats} alternating fresh-process runs per side "
        f"(trl-default: {min(args.default_repeats, args.repeats)}); "
        f"torch threads {args.threads}; ms are per round"
    )
    for cell, per_side in results.items():
        for s in sides:
            if s in per_side:
                emit(f"{cell} {s} ({per_side[s]['repeats']} run(s)): {per_side[s]['paths']}")
    for v in verdicts:
        emit(v)
    return lines


# ---- driver -------------------------------------------------------------------------------


def parse_cells(text: str) -> list[tuple[str, int, int]]:
    cells = ALL_CELLS if text == "all" else [c.strip() for c in text.split(",") if c.strip()]
    out = []
    for cell in cells:
        parts = cell.split(":")
        if len(parts) != 3 or parts[0] not in bench.MODELS:
            raise argparse.ArgumentTypeError(f"cell {cell!r}: want MODEL:GROUP:LENGTH with MODEL in {bench.MODELS}")
        out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="all", help=f"comma-separated MODEL:GROUP:LENGTH (default all: {','.join(ALL_CELLS)})")
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process runs per side and cell (medians)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per process (medians)")
    parser.add_argument("--prompts", type=int, default=2, choices=(1, 2), help="groups (prompts) a round")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 prompt a round, 1 timed round per process, trl-default once (for a busy or small machine)",
    )
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated subset of {','.join(SIDES)}")
    parser.add_argument(
        "--default-repeats", type=int, help="runs of trl-default, the slow reference column (default: --repeats; --quick: 1)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads on every side")
    parser.add_argument("--trl-python", type=Path, default=DEFAULT_TRL_PYTHON)
    parser.add_argument("--models-dir", type=Path, help="keep the built models here (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per measurement process")
    parser.add_argument("--json", type=Path, help="also write every raw measurement here")
    parser.add_argument(
        "--profile", action="store_true", help="also print torch.profiler tables of Kiln's sampling and training (one extra, untimed round)"
    )
    parser.add_argument("--kiln-worker", help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.kiln_worker:
        print("KILN_RESULT " + json.dumps(kiln_worker(json.loads(args.kiln_worker))), flush=True)
        return 0
    if args.quick:
        args.prompts, args.rounds = 1, 1
        args.default_repeats = 1 if args.default_repeats is None else args.default_repeats
    if args.default_repeats is None:
        args.default_repeats = args.repeats
    cells = parse_cells(args.cells)
    sides = [s for s in args.sides.split(",") if s]
    if unknown := set(sides) - set(SIDES):
        parser.error(f"unknown sides {sorted(unknown)}")
    notes = []
    if any(s.startswith("trl") for s in sides) and not args.trl_python.exists():
        notes.append(f"TRL not run: {args.trl_python} does not exist (run bash benchmarks/trl_env.sh)")
        sides = [s for s in sides if not s.startswith("trl")]
    peak = bench.matmul_peak(args.threads, size=3072, repeats=5)
    with tempfile.TemporaryDirectory() as tmp:
        models = bench.prepare_models(args.models_dir or Path(tmp), sorted({c[0] for c in cells}))
        raw: dict[str, dict[str, list]] = {f"{m}:{g}:{n}": {s: [] for s in sides} for m, g, n in cells}
        started = time.perf_counter()
        for repeat in range(args.repeats):
            order = sides[repeat % len(sides) :] + sides[: repeat % len(sides)]  # rotate who goes first
            for model, group, length in cells:
                cell = f"{model}:{group}:{length}"
                shape = bench.Shape.of(models[model])
                for side in order:
                    if side == "trl-default" and repeat >= args.default_repeats:
                        continue
                    print(
                        f"[{time.perf_counter() - started:6.0f}s] repeat {repeat + 1}/{args.repeats} {cell} {side}",
                        file=sys.stderr,
                        flush=True,
                    )
                    try:
                        data = run_side(side, models[model], group, length, args, profile=args.profile and repeat == 0)
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        notes.append(f"{cell} {side} repeat {repeat + 1}: {str(exc)[-600:]}")
                        continue
                    raw[cell][side].append({"raw": data, "row": summarise(side, data, shape, group, length)})
        results = {
            cell: {s: median_rows([m["row"] for m in runs]) for s, runs in per_side.items() if runs}
            for cell, per_side in raw.items()
        }
    print()
    print_table(results, peak, sides, args)
    for note in notes:
        print("note:", note)
    if args.json:
        args.json.write_text(json.dumps({"peak_flops": peak, "results": results, "raw": raw, "notes": notes}, indent=1) + "\n")
    if args.profile:
        for cell, per_side in raw.items():
            profiles = [run["raw"]["profile"] for run in per_side.get("kiln", []) if run["raw"].get("profile")]
            for part, table in (profiles[0] if profiles else {}).items():
                print(f"\nprofile of Kiln's {part} in an extra untimed round, {cell} (torch.profiler):")
                print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
