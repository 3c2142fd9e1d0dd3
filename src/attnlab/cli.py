"""The ``attnlab`` command: parses arguments, then hands over to the tasks and the run objects.

``attnlab train TASK`` is built from the task registry: the task's options (every config
field, grouped by section, with the values the command will really use as defaults) are added
only once TASK is known, so ``attnlab --help`` and ``attnlab train --help`` import no torch.
Every command that takes a run directory loads it with ``load_run`` and calls the verb.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attnlab.configs import (
    add_dataclass_arguments,
    collect_overrides,
    parse_key_values,
    refuse_conflicts,
)
from attnlab.errors import UserError
from attnlab.explore import command as explore_command
from attnlab.runs.registry import REGISTRY
from attnlab.verify import command as verify_command

RUN_HELP = "run directory (written by `attnlab train`)"
ENCODER_HELP = (
    "the pretrained encoder: e5 (multilingual-e5-small, ~100 languages; the default), minilm "
    "(all-MiniLM-L6-v2, English), a BERT / XLM-R checkpoint folder or an `attnlab train mlm` run"
)


# ---------------------------------------------------------------------------- train


def _add_train(sub: argparse._SubParsersAction) -> None:
    tasks = "\n".join(f"  {name:<14} {entry.help}" for name, entry in REGISTRY.items())
    p = sub.add_parser(
        "train",
        help="train a model; writes a run directory",
        description=f"Train a model into a run directory.\n\ntasks:\n{tasks}\n\n"
        "`attnlab train TASK --help` lists TASK's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("task", choices=list(REGISTRY), metavar="TASK")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def task_parser(name: str, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of `attnlab train NAME`: general options, then each config section's fields.

    Defaults shown are the values the command will use: the task's bundled preset, or the
    preset named by ``--config`` in ``argv``."""
    from attnlab.runs import training
    from attnlab.runs.registry import get_task

    task = get_task(name)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    preset = pre.parse_known_args(argv)[0].config
    arch = chosen_arch(task, argv)
    p = argparse.ArgumentParser(
        prog=f"attnlab train {task.name}",
        description=f"{REGISTRY[task.name].help}. Every config field is an option; key=value "
        "positionals work too (n_heads=8). Defaults shown are the "
        + (f"values of --config {preset}." if preset else "bundled preset's values."),
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.add_argument(
        "--out", default=None, help=f"run directory (default: runs/{task.name}, or -2, -3, ...)"
    )
    p.add_argument("--config", default=None, help="a TOML preset file or a bundled preset name")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    if task.archs:
        p.add_argument(
            "--arch",
            default=None,
            help=f"the architecture, a model of `attnlab models`: {task.arch_help()} "
            f"(default {task.archs[0]}; the options below are {arch}'s)",
        )
    try:
        values = training.build_config(task, preset, {"arch": arch or None}).sections
    except ValueError:
        values = {}  # a bad --config is reported when the command runs
    for section, cls in task.arch_sections(arch).items():
        group = p.add_argument_group(f"[{section}]")
        add_dataclass_arguments(group, cls, defaults=values.get(section))
    return p


def chosen_arch(task: Any, argv: list[str]) -> str:
    """The architecture whose options `attnlab train TASK argv` takes: ``--arch``, on
    ``--resume`` the one the run in ``--out`` records, else the task's default ("" for a task
    of one architecture). A name the task does not offer is refused in one line."""
    from attnlab.runs import training
    from attnlab.runs.load import recorded

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--arch", default=None)
    pre.add_argument("--out", default=None)
    pre.add_argument("--resume", action="store_true")
    known = pre.parse_known_args(argv)[0]
    arch = training.check_arch(task, known.arch)
    if task.archs and known.arch is None and known.resume and known.out is not None:
        try:
            kind = recorded(known.out)
        except UserError:
            return arch  # the resume itself says what is wrong with the folder
        if kind is not None and kind[0] == task.name:
            return kind[1]
    return arch


def _run_train(args: argparse.Namespace) -> int:
    from attnlab.runs import folder, training
    from attnlab.runs.registry import get_task

    name = args.task
    parser = task_parser(name, args.rest)
    refuse_other_archs(get_task(name), parser, args.rest)
    opts = parser.parse_args(args.rest)
    check_device(opts.device)
    overrides = parse_key_values(opts.overrides)
    if "arch" in overrides:  # it picks the options the parser offers: read before parsing
        raise UserError(f"arch={overrides['arch']}: choose the architecture with --arch NAME")
    task = get_task(name)
    for cls in task.arch_sections(chosen_arch(task, args.rest)).values():
        flags = collect_overrides(opts, cls)
        refuse_conflicts(overrides, flags)
        overrides.update(flags)
    if vars(opts).get("arch") is not None:
        overrides["arch"] = opts.arch
    refuse_ignored(overrides)
    if opts.out is None:
        out = Path(f"runs/{name}")
        # under torchrun every rank must pick the same folder: no numbering there
        if not (opts.resume or folder.distributed()):
            out = folder.free_run_dir(out)
    else:
        out = Path(opts.out)
    results = training.train(name, out, overrides, opts.config, opts.resume, opts.device)
    if folder.is_main_process():
        for line in training.describe(name, results, out):
            print(line)
    return 0


def refuse_other_archs(task: Any, parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """An option that only another ``--arch`` of the task has is refused in one line naming
    that architecture (argparse would only say it is unrecognized)."""
    import dataclasses

    if not task.archs:
        return
    _, unknown = parser.parse_known_args(argv)
    arch = chosen_arch(task, argv)
    for item in unknown:
        if not item.startswith("--"):
            continue
        flag = item.split("=", 1)[0]
        field = flag[2:].replace("-", "_")
        for other in task.archs:
            fields = {f.name for cls in task.arch_sections(other).values()
                      for f in dataclasses.fields(cls)}  # fmt: skip
            if other != arch and field in fields:
                raise UserError(
                    f"{flag} is a setting of --arch {other}, not of --arch {arch}; add --arch "
                    f"{other}, or drop it (`attnlab train {task.name} --help` lists {arch}'s)"
                )


# Attention settings a language model without attention layers never reads: given on the
# command line with such a mixer they would be ignored, so they are refused (a preset's own
# values are not: they were not asked for here).
ATTENTION_ONLY = ("backend", "attention", "window", "n_global", "n_kv_heads", "qk_norm")
ATTENTION_FREE = ("mamba", "rwkv")


def refuse_ignored(overrides: dict[str, str]) -> None:
    """Refuse a command line that sets what its own other settings make unused."""
    mixer = overrides.get("mixer")
    typed = [k for k in ATTENTION_ONLY if k in overrides]
    if mixer in ATTENTION_FREE and typed:
        flags = ", ".join("--" + k.replace("_", "-") for k in typed)
        raise UserError(
            f"{flags} would be ignored: --mixer {mixer} has no attention layers; drop "
            f"{'them' if len(typed) > 1 else 'it'}, or use --mixer hybrid (attention every "
            "--attn-every layers)"
        )


# ---------------------------------------------------------------------------- run verbs


def _load(run: str, verb: str, device: str = "cpu") -> Any:
    from attnlab.runs import load_run

    loaded = load_run(run, device)
    loaded.require(verb)
    return loaded


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="score a run: accuracy/F1 and confusion matrix, or BLEU/chrF")
    p.add_argument("run", help=RUN_HELP)
    p.add_argument("--data", default=None, help="a labelled file (default: the run's own split)")
    p.add_argument("--split", default="test", choices=("train", "val", "test"))
    p.add_argument("--text-col", default=None)
    p.add_argument("--label-col", default=None)
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _run_eval(args: argparse.Namespace) -> int:
    run = _load(args.run, "evaluate")
    if args.data is None:
        from attnlab.runs.load import require_data

        require_data(run)
    columns = {k: v for k, v in (("text_col", args.text_col), ("label_col", args.label_col)) if v}
    report = run.evaluate(data=args.data, split=args.split, **columns)
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=2))
    elif hasattr(run, "report_text"):
        print(run.report_text(report))
    else:
        from attnlab.metrics import format_report

        print(format_report(report))
    return 0


def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="label and probabilities for texts or images")
    p.add_argument("run", help=RUN_HELP)
    p.add_argument("texts", nargs="*", help="texts (or image files); none = lines on stdin")
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per line; text runs add unknown_share (the share of <unk> "
        "tokens), out_of_reach (over 0.3) and truncated (longer than the run reads), warned "
        "about in plain output",
    )
    p.add_argument(
        "--data",
        default=None,
        help="score this CSV, TSV or JSONL file instead (needs --out): every column kept, "
        "predicted_label and prob_<class> columns added",
    )
    p.add_argument("--text-col", default="text", help="--data's text column (default text)")
    p.add_argument("--out", default=None, help="where --data's scored rows go (.csv/.tsv/.jsonl)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an --out that a stopped run left: rows already there are not rescored",
    )
    add_threads(p, "default: fp32 on 1 thread; with --data, auto")


def add_threads(p: argparse.ArgumentParser, default: str) -> None:
    """--threads, --batch-size and --precision, as attnlab.load takes them; ``default`` says
    in the help what they are when not given (:func:`open_for_predict` decides)."""
    p.add_argument(
        "--threads",
        type=threads_arg,
        default=None,
        help="torch intra-op threads: auto (1 or every usable core, whichever is measured "
        "faster at start: on a machine other processes share, more threads than free cores "
        f"slow each forward pass many times over), N, or 0 = torch's setting ({default})",
    )
    p.add_argument(
        "--batch-size", type=int, default=64, help="texts per forward pass at most (default 64)"
    )
    p.add_argument(
        "--precision",
        choices=("auto", "fp32", "int8", "bf16"),
        default=None,
        help="the forward pass: fp32, int8 (dynamically quantized Linear layers), bf16 (where "
        "the CPU has it), or auto: the fastest whose labels equal fp32's on a check set, "
        f"measured at start ({default}); the path taken is said on stderr",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="run the path through torch.compile (fp32 or bf16; needs a C++ compiler): it "
        "compiles at start, which takes tens of seconds, then short texts run faster "
        "(docs/results/throughput.md); for long files and servers",
    )


def threads_arg(value: str) -> int | str:
    """--threads: "auto" or a whole number."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give auto or a whole number") from None


def open_for_predict(args: argparse.Namespace, default: str) -> Any:
    """The run with the path --precision / --threads ask for, the choice said on stderr when
    it was measured or asked for, and always by serve of a text classifier."""
    from attnlab.api import LoadedRun

    precision = args.precision or default
    threads = args.threads if args.threads is not None else "auto" if default == "auto" else 1
    loaded = LoadedRun.open(args.run, getattr(args, "device", "cpu"), threads, args.batch_size,
                            precision, args.compile)  # fmt: skip
    path = loaded.inference_path
    text_classifier = "predict" in loaded.run.verbs and hasattr(loaded.run, "tokenizer")
    serving = args.command == "serve" and text_classifier  # a run serve refuses says only that
    asked = args.precision is not None or args.compile or "auto" in (precision, threads)
    if serving or (asked and args.command != "serve"):
        print(f"{args.command}: {path.reason}", file=sys.stderr, flush=True)
    return loaded


PREDICT_CHUNK = 1024  # inputs read and answered at a time: output streams, memory stays flat


def _run_predict(args: argparse.Namespace) -> int:
    from attnlab.data.io import read_stdin, split_lines

    if args.data is not None:
        return _score_file(args)
    if args.out is not None or args.resume:
        raise UserError("--out and --resume go with --data FILE; without it predictions print")
    loaded = open_for_predict(args, "fp32")
    loaded.run.require("predict")
    inputs = args.texts or [line for line in split_lines(read_stdin()) if line.strip()]
    if not inputs:
        raise UserError("nothing to predict: pass texts (or image files) or pipe lines on stdin")
    noted = False
    for start in range(0, len(inputs), PREDICT_CHUNK):  # main's results_out checks the writes
        for pred in loaded.predict(inputs[start : start + PREDICT_CHUNK]):
            print_prediction(pred, args.json, loaded.run)
            if pred.get("longer_than_training") and not noted:
                note_longer(loaded.run, "a text is")
                noted = True
    return 0


def note_longer(run: Any, which: str) -> None:
    """Say once on stderr that texts ran past what training read (predict reads more)."""
    print(f"predict: note: {which} longer than the {run.train_len} pieces training read (this "
          f"run reads up to {run.max_len}); the model never saw positions past "
          f"{run.train_len}: longer_than_training marks such texts", file=sys.stderr)  # fmt: skip


def _score_file(args: argparse.Namespace) -> int:
    """predict --data FILE --out OUT: the file scored, a progress bar on stderr."""
    from attnlab.data.io import output_errors

    if args.texts:
        raise UserError("give texts or --data FILE, not both")
    if args.out is None:
        raise UserError("--data needs --out FILE (.csv, .tsv or .jsonl) for the scored rows")
    from pathlib import Path

    from attnlab.infer.score_file import read_table

    read_table(args.data, args.text_col)  # a bad file stops here, before the model loads
    if Path(args.out).exists() and not args.resume:
        raise UserError(f"{args.out} exists; pass --resume to continue scoring into it, or "
                        "another --out")  # fmt: skip
    loaded = open_for_predict(args, "auto")
    with output_errors("--out"):
        done = loaded.score_file(args.data, args.out, args.text_col, args.resume)
    if done["longer_than_training"]:
        note_longer(loaded.run, f"{done['longer_than_training']} of the texts scored are")
    again = f" ({done['resumed']} were in it already)" if done["resumed"] else ""
    print(f"scored {done['scored']} of {done['rows']} rows{again} in {done['seconds']:.1f} s "
          f"({done['texts_per_s']:.1f} texts/s); written to {done['out']}")  # fmt: skip
    return 0


def print_prediction(pred: dict[str, Any], as_json: bool, run: Any) -> None:
    if as_json:
        print(json.dumps(pred, ensure_ascii=False))
        return
    top = sorted(pred["probs"].items(), key=lambda kv: -kv[1])[:3]
    probs = "  ".join(f"{k} {v:.3f}" for k, v in top)
    print(f"{pred['label']}\t{probs}\t{pred.get('text', pred.get('image'))}")
    if pred.get("warning"):  # mostly <unk>: see data/coverage.py
        print(f"  warning: {pred['warning']}")
    if pred.get("truncated"):
        size = f"{pred['tokens']} tokens" if "tokens" in pred else "longer than the run reads"
        print(f"  warning: {size}; the model read the first {run.max_len}, the rest did not count")


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="a classifier run behind a JSON API (POST /predict, GET /health, GET /info)",
        description="Serve a classifier run's predictions as JSON over HTTP on this machine: "
        'POST /predict {"texts": [...]} -> {"predictions": [...]} (what predict --json '
        "prints), GET /health, GET /info (labels, source, limits). Requests that arrive "
        "together are classified in one forward pass. Stop it with Ctrl-C.",
    )
    p.add_argument("run", help=RUN_HELP)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 = every "
        "interface, reachable from other machines)",
    )
    p.add_argument("--port", type=int, default=8000, help="0 picks a free one (default 8000)")
    p.add_argument(
        "--max-texts", type=int, default=256, help="texts in one request at most (default 256)"
    )
    p.add_argument(
        "--max-body", type=int, default=1024, help="KiB in one request at most (default 1024)"
    )
    p.add_argument(
        "--drain",
        type=float,
        default=30.0,
        help="seconds a stop (Ctrl-C, SIGTERM) lets the requests in flight finish; those still "
        "running then get 503 (default 30)",
    )
    p.add_argument(
        "--access-log",
        action="store_true",
        help="a line per request on stderr (default: one line a minute summing the answers)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    add_threads(p, "default: auto, the path and the threads measured at start")


def _run_serve(args: argparse.Namespace) -> int:
    from attnlab.api import check_settings
    from attnlab.serve.http import check_port

    check_port(args.port)
    check_settings(1 if args.threads in (None, "auto") else args.threads, args.batch_size)
    for flag, value in (("--max-texts", args.max_texts), ("--max-body", args.max_body)):
        if value < 1:
            raise UserError(f"{flag} must be >= 1, got {value}")
    if not 0.1 <= args.drain <= 3600:  # nan fails too
        raise UserError(f"--drain {args.drain}: give seconds from 0.1 to 3600 (default 30)")
    loaded = open_for_predict(args, "auto")
    from attnlab.serve.app import serve

    busy = serve(loaded, args.host, args.port, args.max_texts, args.max_body * 1024,
                 drain=args.drain, access_log=args.access_log)  # fmt: skip
    if busy:  # a forward pass the stop cut runs on: exit by the deadline, not when it ends
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _add_attention(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attention", help="attention heatmaps (text) or rollout (image) as a PNG")
    p.add_argument("run", help=RUN_HELP)
    p.add_argument("text", help="the text (or image file) to look inside")
    p.add_argument("--out", default=None, help="image path (default: RUN/attention.png)")
    p.add_argument(
        "--member", type=int, default=1, help="for an ensemble run: whose attention to draw (1..M)"
    )


def _run_attention(args: argparse.Namespace) -> int:
    from attnlab.data.io import output_errors

    run = _load(args.run, "attention")
    with output_errors("--out"):
        lines = run.draw_attention(args.text, args.out, member=args.member)
    for line in lines:
        print(line)
    return 0


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="continue a prompt with a trained language model (or a Hugging Face GPT-2 dir)",
    )
    p.add_argument("run", help="run directory of `attnlab train lm`, or a GPT-2 checkpoint dir")
    p.add_argument("--prompt", default=None, help="text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (1 = off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-samples", type=int, default=1, help="samples, generated as one batch")
    p.add_argument(
        "--stop", action="append", default=[], help="end a sample before this text (repeatable)"
    )
    p.add_argument("--no-cache", action="store_true", help="recompute the window at every step")
    p.add_argument(
        "--draft", default=None, help="speculative decoding: a small LM run, same tokenizer"
    )
    p.add_argument(
        "--prompt-lookup", action="store_true", help="speculative decoding without a draft model"
    )
    p.add_argument(
        "--lookahead",
        type=int,
        default=None,
        help="speculative: tokens drafted per pass (default 4)",
    )
    p.add_argument(
        "--kv-cache", default="float", help="float, or int8 (a scale per token and head)"
    )
    p.add_argument("--device", default="cpu")


def _run_generate(args: argparse.Namespace) -> int:
    """Stream one sample as it is produced; several are printed one after another."""
    from attnlab.infer.lm import LMRun, check_request, default_prompt

    check_request(args.max_new_tokens, args.num_samples, args.temperature, args.top_k, args.top_p)
    refuse_unused_decoding(args)
    run = LMRun.load(args.run, args.device)
    drafter = _drafter(args, run)
    if not args.no_cache:
        from attnlab.infer.generation import new_caches

        new_caches(run.model, args.kv_cache)  # refused before anything is printed
    prompt = default_prompt(run.tokenizer) if args.prompt is None else args.prompt
    streaming = args.num_samples == 1

    def on_text(_: int, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    context = run.model.cfg.context
    n_prompt = len(run.tokenizer.encode(prompt)) if prompt else 0
    if n_prompt > context:
        print(
            f"attnlab: warning: the prompt has {n_prompt} tokens, more than the model's context "
            f"of {context}; only its last {context} tokens are used",
            file=sys.stderr,
        )
    shown = args.prompt or ""  # the default prompt (a newline, <|endoftext|>) is not echoed
    if streaming:
        sys.stdout.write(shown)
    out = run.generate(
        prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        num_samples=args.num_samples,
        stops=args.stop,
        use_cache=not args.no_cache,
        on_text=on_text if streaming else None,
        device=args.device,
        kv_cache=args.kv_cache,
        **({} if drafter is None else {"drafter": drafter}),
        **({} if args.lookahead is None else {"lookahead": args.lookahead}),
    )
    if streaming:
        sys.stdout.write("\n")
    else:
        for i, text in enumerate(out.texts):
            print(f"--- sample {i + 1} ---\n{shown}{text}")
    if out.speculative is not None:
        s = out.speculative
        print(
            f"attnlab: speculative: {s['rounds']} passes of the model for {s['emitted']} tokens "
            f"({s['tokens_per_round']:.2f} per pass), {s['accepted']}/{s['proposed']} drafted "
            f"tokens accepted ({s['acceptance_rate']:.0%})",
            file=sys.stderr,
        )
    return 0


def refuse_unused_decoding(args: argparse.Namespace) -> None:
    """Refuse a generate option that the others make unused (it would be dropped silently)."""
    speculative = args.draft is not None or args.prompt_lookup
    if args.no_cache and args.kv_cache != "float":
        raise UserError(
            f"--kv-cache {args.kv_cache} has no cache to act on with --no-cache; drop one"
        )
    if args.no_cache and speculative:
        raise UserError(
            "--no-cache would be ignored: speculative decoding (--draft, --prompt-lookup) "
            "always decodes with the cache; drop one"
        )
    if args.lookahead is not None and not speculative:
        raise UserError(
            f"--lookahead {args.lookahead} would be ignored: it is the tokens drafted per pass "
            "of speculative decoding; add --draft RUN or --prompt-lookup, or drop it"
        )


def _drafter(args: argparse.Namespace, run: Any) -> Any:
    """The speculative drafter --draft / --prompt-lookup ask for, or None."""
    from attnlab.infer.lm import LMRun
    from attnlab.infer.speculative import (
        ModelDrafter,
        NgramDrafter,
        check_draft,
        check_lookahead,
    )

    if args.draft is None and not args.prompt_lookup:
        return None
    if args.draft is not None and args.prompt_lookup:
        raise UserError("--draft and --prompt-lookup are two drafters: choose one")
    if args.lookahead is not None:
        check_lookahead(args.lookahead)
    if args.prompt_lookup:
        return NgramDrafter()
    draft = LMRun.load(args.draft, args.device)
    check_draft(run.model, draft.model)
    if draft.tokenizer.to_json() != run.tokenizer.to_json():
        raise UserError(
            f"the draft {args.draft} has another tokenizer than {args.run}: a draft must use the "
            "target's tokenizer"
        )
    return ModelDrafter(draft.model)


def _add_translate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate sentences with a trained translation run")
    p.add_argument("run", help="run directory of `attnlab train translate`")
    p.add_argument("texts", nargs="*", help="sentences; none = --input or stdin lines")
    p.add_argument("--input", default=None, help="a file of sentences, one a line")
    p.add_argument("--output", default=None, help="write translations here (default: stdout)")
    p.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy)")


def _run_translate(args: argparse.Namespace) -> int:
    from attnlab.data.io import read_stdin, read_utf8, split_lines

    run = _load(args.run, "translate")
    if args.texts:
        texts = list(args.texts)
    elif args.input:
        texts = split_lines(read_utf8(args.input, "input file"))
    else:
        texts = split_lines(read_stdin())
    if not any(t.strip() for t in texts):
        raise UserError("no text given: pass sentences, --input FILE, or lines on stdin")
    for i, n_unk, n in run.unknown(texts):
        print(
            f"attnlab: warning: input {i} has {n_unk} of {n} tokens outside the model's source "
            "vocabulary (<unk>); its translation is a guess",
            file=sys.stderr,
        )
    hyps = [h if t.strip() else "" for t, h in zip(texts, run.translate(texts, args.beam))]
    text = "".join(h + "\n" for h in hyps)
    if args.output:
        from attnlab.data.io import output_errors

        with output_errors("--output"):
            Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


# ---------------------------------------------------------------------------- pretrained encoders


def _add_prune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prune", help="remove the N least important attention heads of a classifier")
    p.add_argument("run", help=RUN_HELP)
    p.add_argument("--heads", type=int, required=True, help="how many heads to remove")
    p.add_argument("--out", required=True, help="the new run folder")


def _run_prune(args: argparse.Namespace) -> int:
    from attnlab.commands.prune import prune_run

    r = prune_run(args.run, args.heads, args.out)
    print(
        f"removed {args.heads} heads, kept {r['heads_per_layer']} per layer; val accuracy "
        f"{r['val_before']['accuracy']:.4f} -> {r['val_after']['accuracy']:.4f}; attention "
        f"parameters {r['parameters_before']['attention']} -> "
        f"{r['parameters_after']['attention']}; run in {args.out} (prune.json)"
    )
    return 0


def _add_embed(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("embed", help="sentence vectors from a pretrained encoder (JSON or .npy)")
    p.add_argument("texts", nargs="+", help="sentences to embed")
    p.add_argument("--arch", default="e5", help=ENCODER_HELP)
    p.add_argument("--out", default=None, help="write vectors to FILE.npy or FILE.json")
    p.add_argument(
        "--role",
        choices=("query", "passage"),
        default=None,
        help='for an encoder trained with input prefixes (e5): "query: " before each text '
        '(the default: classification, similarity, queries) or "passage: " (documents to be '
        "found)",
    )


def _run_embed(args: argparse.Namespace) -> int:
    from attnlab.infer.embeddings import SentenceEncoder, check_vectors_out, write_vectors

    if args.out is not None:
        check_vectors_out(args.out)  # before the encoder loads
    encoder = SentenceEncoder.load(args.arch, role=args.role)
    vectors = encoder.encode(args.texts)
    text = write_vectors(vectors, args.texts, args.out)
    if text is not None:
        print(text)
    else:
        print(f"{len(args.texts)} vectors of {vectors.shape[1]} numbers written to {args.out}")
    return 0


def _add_similarity(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("similarity", help="cosine similarity of two sentences' vectors")
    p.add_argument("a", help="first sentence")
    p.add_argument("b", help="second sentence")
    p.add_argument("--arch", default="e5", help=ENCODER_HELP)


def _run_similarity(args: argparse.Namespace) -> int:
    from attnlab.infer.embeddings import SentenceEncoder, similarity

    print(f"{similarity(SentenceEncoder.load(args.arch), args.a, args.b):.4f}")
    return 0


def _add_search(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="the lines of a text file closest in meaning to a query")
    p.add_argument("file", help="UTF-8 text file, one document per line")
    p.add_argument("queries", nargs="+", help="what to look for")
    p.add_argument("-k", "--k", type=int, default=5, help="results per query (default 5)")
    p.add_argument("--arch", default="e5", help=ENCODER_HELP)
    p.add_argument("--json", action="store_true", help="one JSON object per result")


def _run_search(args: argparse.Namespace) -> int:
    from attnlab.infer.embeddings import SentenceEncoder, read_lines, search

    docs = read_lines(args.file)
    hits = search(SentenceEncoder.load(args.arch), docs, args.queries, args.k)
    for query, ranked in zip(args.queries, hits):
        if not args.json:
            print(f"query: {query}")
        for rank, (index, score) in enumerate(ranked, start=1):
            if args.json:
                row = {"query": query, "rank": rank, "score": score, "text": docs[index]}
                print(json.dumps(row, ensure_ascii=False))
            else:
                print(f"  {rank}. {score:.4f}  {docs[index]}")
    return 0


# ---------------------------------------------------------------------------- studies


def _add_ablate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ablate", help="train variants of a preset and compare them")
    p.add_argument("task", choices=("classify",))
    p.add_argument(
        "factors",
        nargs="+",
        metavar="FIELD=V1,V2,...",
        help="values to try per config field, e.g. lr=1e-5,3e-5 train_layers=4,12",
    )
    p.add_argument(
        "--arch", default="e5", help="whose recipe: e5 (the main job's, default), char, minilm"
    )
    p.add_argument(
        "--grid", action="store_true", help="full product of the factors (default: one at a time)"
    )
    p.add_argument("--seeds", type=int, default=1, help="seeds per variant (mean ± std)")
    p.add_argument("--steps", type=int, default=0, help="optimizer steps per variant")
    p.add_argument("--epochs", type=int, default=0, help="epochs per variant (instead of --steps)")
    p.add_argument(
        "--minutes", type=float, default=0.0, help="stop each variant after this much training"
    )
    p.add_argument("--config", default=None, help="a TOML preset to vary around")
    p.add_argument("--out", default="runs/ablate-classify", help="sweep folder")
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="fixed overrides for every variant",
    )


def _run_ablate(args: argparse.Namespace) -> int:
    from attnlab.commands.ablate import run_sweep

    run_sweep(args)
    return 0


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from attnlab.bench import DEFAULT_OUT, SECTIONS

    p = sub.add_parser(
        "bench",
        help="speed and memory vs PyTorch / Hugging Face; writes one markdown report",
        description="Attention kernels (explicit, fused, local, linear), MHA vs "
        "nn.MultiheadAttention, encoder layer vs nn.TransformerEncoderLayer, GPT training step "
        "vs GPT2LMHeadModel (with gradient checkpointing memory), generation with and without "
        "cache, and long-sequence scaling.",
    )
    p.add_argument("--quick", action="store_true", help="small shapes, few rounds (~1 minute)")
    p.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"the report, FILE.md (its data beside it as FILE.json), or a folder to write "
        f"{DEFAULT_OUT} in (default: {DEFAULT_OUT})",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (CUDA events time the GPU)")
    p.add_argument("--num-threads", type=int, default=1, help="torch threads; 0 = default")
    p.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}"
    )


def _run_bench(args: argparse.Namespace) -> int:
    from attnlab.bench.command import run_bench

    sections = tuple(s for s in args.only.split(",") if s)
    out = run_bench(args.out, args.quick, args.device, args.num_threads, sections)
    print(out.read_text())
    print(f"report written to {out} (data in {out.with_suffix('.json')})")
    return 0


def _add_quantize(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="copy a run with int8 linear layers (every verb reads it)")
    p.add_argument("run", help=RUN_HELP)
    p.add_argument("--out", required=True, help="a new folder for the int8 run")
    p.add_argument(
        "--activations",
        default="none",
        choices=("none", "dynamic"),
        help="none = int8 weights only; dynamic = also int8 activations per token",
    )


def _run_quantize(args: argparse.Namespace) -> int:
    from attnlab.commands.quantize import quantize_run

    info = quantize_run(args.run, args.out, args.activations)
    print(f"{args.out}: {info['layers']} linear layers int8, activations {info['activations']}")
    return 0


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="a fine-tuned classifier as a Hugging Face folder or an ONNX file"
    )
    p.add_argument("run", help="a `train classify` run of a pretrained encoder (e5, BERT)")
    p.add_argument("--format", required=True, choices=("hf", "onnx"), help="hf or onnx")
    p.add_argument("--out", required=True, help="a new folder (hf) or FILE.onnx")
    p.add_argument(
        "--words",
        default="auto",
        choices=("auto", "float16", "float32"),
        help="hf: the word table's type in the file (auto: float16 for a run that keeps it "
        "4-bit, half float32's size, values rounded by at most 2^-11 of their size; else "
        "float32, as the run has it)",
    )


def _run_export(args: argparse.Namespace) -> int:
    from attnlab.commands.export import export_run

    try:
        done = export_run(args.run, args.format, args.out, args.words)
    except KeyboardInterrupt:
        print(f"attnlab: export interrupted; nothing written to {args.out}", file=sys.stderr)
        return 130
    print(f"{done.path}: {args.format} export of {args.run}")
    for note in done.notes:
        print(f"  note: {note}")
    return 0


def _add_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="every model attnlab builds: family, size, the verify row")
    p.add_argument("--family", default=None, help="only this family (gpt, bert, vit, ...)")


def _run_models(args: argparse.Namespace) -> int:
    from attnlab.models.registry import models_table

    print(models_table(args.family))
    return 0


Command = tuple[Callable[[argparse._SubParsersAction], None], Callable[[argparse.Namespace], int]]
COMMANDS: dict[str, Command] = {
    "train": (_add_train, _run_train),
    "export": (_add_export, _run_export),
    "eval": (_add_eval, _run_eval),
    "predict": (_add_predict, _run_predict),
    "serve": (_add_serve, _run_serve),
    "attention": (_add_attention, _run_attention),
    "generate": (_add_generate, _run_generate),
    "translate": (_add_translate, _run_translate),
    "embed": (_add_embed, _run_embed),
    "similarity": (_add_similarity, _run_similarity),
    "search": (_add_search, _run_search),
    "ablate": (_add_ablate, _run_ablate),
    "bench": (_add_bench, _run_bench),
    "quantize": (_add_quantize, _run_quantize),
    "prune": (_add_prune, _run_prune),
    "models": (_add_models, _run_models),
    "explore": (explore_command.add_parser, explore_command.run),
    "verify": (verify_command.add_parser, verify_command.run),
}


# Positionals and options that carry text (not paths) into a model.
TEXT_ARGS = ("texts", "inputs", "text", "prompt", "stop", "a", "b", "queries")


def clean_text_args(args: argparse.Namespace) -> None:
    """Replace, in the text arguments, each byte the shell passed that is not UTF-8 (Python
    keeps it as a lone surrogate, which no tokenizer or encoder accepts) by U+FFFD; refuse such
    bytes in any other argument (a path, a name: run files record them as UTF-8 JSON) and in a
    text argument that names an existing file (an image to predict)."""
    import os

    from attnlab.data.io import clean_text

    def clean(value: Any, text: bool) -> Any:
        if not isinstance(value, str) or clean_text(value) == value:
            return value
        if text and not os.path.exists(value):
            return clean_text(value)
        shown = os.fsencode(value).decode("utf-8", "backslashreplace")
        raise UserError(
            f"the argument '{shown}' holds bytes that are not UTF-8; rename the file or folder "
            "(or retype the value) in UTF-8"
        )

    for name, value in vars(args).items():
        text = name in TEXT_ARGS
        cleaned = [clean(v, text) for v in value] if isinstance(value, list) else clean(value, text)
        setattr(args, name, cleaned)


def check_device(device: str | None) -> None:
    """Refuse a --device this torch cannot use, before anything is loaded or written (the
    check ``attnlab.load`` makes of its ``device``)."""
    if device is None:
        return
    from attnlab.api import check_device as check

    check(device, "--device")


# What each command prints on standard output, as its refusals name it; the servers (serve,
# explore) print only where they listen and log to standard error, so they run without one.
RESULTS = {
    "predict": "the predictions", "eval": "the report", "embed": "the vectors",
    "similarity": "the similarity", "search": "the results", "models": "the models table",
    "generate": "the generated text", "translate": "the translations",
}  # fmt: skip
SERVERS = ("serve", "explore")


class ResultsUnwritable(Exception):
    """Standard output refused a command's results (a full disk, a file too large)."""

    def __init__(self, err: OSError) -> None:
        super().__init__(err.strerror or str(err))


class CheckedStdout:
    """sys.stdout while a command runs: a write or flush the file system refuses becomes
    ResultsUnwritable, told apart from the command's own files' errors."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            raise  # the reader went away: main's ending
        except OSError as err:
            raise ResultsUnwritable(err) from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise ResultsUnwritable(err) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def results_out(command: str) -> Iterator[None]:
    """Run ``command``, whose results go to standard output, and make sure they arrived: a
    closed standard output (``>&-``, where print() writes nowhere) is refused before the
    command starts, and a write the file system refuses (a full disk: ``> /dev/full``) is one
    line naming where to send them instead, not a traceback or a silent exit 0."""
    if command in SERVERS:
        yield
        return
    what = RESULTS.get(command, f"`attnlab {command}`'s output")
    if sys.stdout is None:
        raise UserError(f"standard output is closed; send {what} to a file or a pipe")
    stream = sys.stdout
    sys.stdout = CheckedStdout(stream)  # type: ignore[assignment]
    try:
        yield
        sys.stdout.flush()  # a full disk shows here, not after the exit status is decided
        sys.stdout = stream
    except ResultsUnwritable as err:
        sys.stdout = None  # type: ignore[assignment]  # nothing more to flush there
        raise UserError(
            f"cannot write {what} to standard output ({err}); redirect it somewhere with room "
            "(> FILE)"
        ) from None
    except BaseException:
        if isinstance(sys.stdout, CheckedStdout):
            sys.stdout = stream
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnlab",
        description="Transformers written by hand in PyTorch: train, inspect and compare them.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    # argparse fills a trailing `nargs="*"` positional before later options are seen, so
    # `predict RUN --json "text"` leaves "text" over: hand such leftovers to the inputs.
    args, extra = parser.parse_known_args(argv)
    if extra:
        trailing = {"predict": "texts", "explore": "inputs"}.get(args.command)
        if trailing is None or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        setattr(args, trailing, list(getattr(args, trailing)) + extra)
    try:
        clean_text_args(args)
        check_device(getattr(args, "device", None))
        with results_out(args.command):
            return COMMANDS[args.command][1](args)
    except UserError as err:  # bad input: a message that says what to change, no traceback
        print(f"attnlab: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # train says what continues it (training.interrupted_note)
        print(f"attnlab: interrupted{f' ({err})' if str(err) else ''}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`attnlab predict ... | head`)
        sys.stdout = None  # type: ignore[assignment]  # no flush of a closed pipe at exit
        return 0
    except Exception:  # a bug: show where, and say so
        traceback.print_exc()
        print(
            f"attnlab: internal error in `attnlab {args.command}`: this is a bug, not a problem "
            "with your input; please report it with the traceback above",
            file=sys.stderr,
        )
        return 1


# Commands that write nothing and start no processes: once their output is out, the process
# may end without the interpreter's teardown, which collects torch's objects (0.6 s of
# `predict`'s 6.2, docs/results/predict_startup.md).
QUICK_EXIT = ("predict",)


def console() -> None:
    """The ``attnlab`` executable: :func:`main`, then the exit."""
    code = main()
    if sys.argv[1:2] and sys.argv[1] in QUICK_EXIT:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:  # None: stdout's reader went away (main's BrokenPipeError)
                    stream.flush()
            except BrokenPipeError:  # the reader went away after the last write
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
