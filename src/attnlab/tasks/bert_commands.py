"""The BERT commands of ``attnlab``: embed, similarity, search, train mlm, train classify --init.

Parsers are built here and registered by :mod:`attnlab.cli`; heavy imports happen only when a
command runs, so ``attnlab --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.configs import add_dataclass_arguments, collect_overrides, parse_key_values

CHECKPOINT_HELP = "BERT checkpoint directory, an `attnlab train mlm` run, or minilm (default)"


def _add_embed(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("embed", help="sentence vectors from a BERT checkpoint (JSON or .npy)")
    p.add_argument("checkpoint", help=CHECKPOINT_HELP)
    p.add_argument("texts", nargs="+", help="sentences to embed")
    p.add_argument("--out", default=None, help="write vectors to FILE.npy or FILE.json")


def _run_embed(args: argparse.Namespace) -> int:
    from attnlab.tasks.bert import SentenceEncoder, write_vectors

    encoder = SentenceEncoder.load(args.checkpoint)
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
    p.add_argument("--checkpoint", default="minilm", help=CHECKPOINT_HELP)


def _run_similarity(args: argparse.Namespace) -> int:
    from attnlab.tasks.bert import SentenceEncoder, similarity

    print(f"{similarity(SentenceEncoder.load(args.checkpoint), args.a, args.b):.4f}")
    return 0


def _add_search(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="the lines of a text file closest in meaning to a query")
    p.add_argument("file", help="UTF-8 text file, one document per line")
    p.add_argument("queries", nargs="+", help="what to look for")
    p.add_argument("-k", "--k", type=int, default=5, help="results per query (default 5)")
    p.add_argument("--checkpoint", default="minilm", help=CHECKPOINT_HELP)
    p.add_argument("--json", action="store_true", help="one JSON object per result")


def _run_search(args: argparse.Namespace) -> int:
    from attnlab.tasks.bert import SentenceEncoder, read_lines, search

    docs = read_lines(args.file)
    hits = search(SentenceEncoder.load(args.checkpoint), docs, args.queries, args.k)
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


COMMANDS = {
    "embed": (_add_embed, _run_embed),
    "similarity": (_add_similarity, _run_similarity),
    "search": (_add_search, _run_search),
}


# ---------------------------------------------------------------------------- train


def add_train_parsers(tasks: argparse._SubParsersAction, classify: argparse.ArgumentParser) -> None:
    """``train mlm``, and the ``--init`` fields that turn ``train classify`` into fine-tuning."""
    from attnlab.tasks import bert_classify, bert_mlm

    taken = set(classify._option_string_actions)
    group = classify.add_argument_group("BERT fine-tuning (with --init CHECKPOINT)")
    for cls in bert_classify.SECTIONS.values():
        _add_new_fields(group, cls, taken)
    p = tasks.add_parser(
        "mlm",
        help="masked-LM pretraining of BERT on any text (bundled Chinese reviews by default)",
        description="Pretrain BERT with masked language modelling (15%% of tokens, 80/10/10).",
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--out", default="runs/mlm", help="run directory (default runs/mlm)")
    p.add_argument("--config", default=None, help="a TOML preset ([data]/[model]/[train])")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    for cls in bert_mlm.SECTIONS.values():
        add_dataclass_arguments(p, cls)


def _add_new_fields(group: argparse._ArgumentGroup, cls: type, taken: set[str]) -> None:
    """Add the ``--field`` options of dataclass ``cls`` that the parser does not have yet."""
    scratch = argparse.ArgumentParser(add_help=False)
    add_dataclass_arguments(scratch, cls)
    for action in scratch._actions:
        if taken.intersection(action.option_strings):
            continue
        extra = {"nargs": action.nargs, "const": action.const} if action.nargs else {}
        group.add_argument(
            *action.option_strings,
            dest=action.dest,
            default=argparse.SUPPRESS,
            metavar=action.metavar,
            help=action.help,
            **extra,
        )
        taken.update(action.option_strings)


def run_train(args: argparse.Namespace) -> int | None:
    """Run ``train mlm`` or ``train classify --init``; None when the command is not BERT's."""
    from attnlab.tasks import bert_classify, bert_mlm

    if args.task == "mlm":
        module = bert_mlm
    elif args.task == "classify" and "init" in vars(args):
        module = bert_classify
    else:
        return None
    overrides = parse_key_values(args.overrides)
    given = {name for name in vars(args) if name not in ("overrides", "out", "config", "resume")}
    known = {name for cls in module.SECTIONS.values() for name in cls.__dataclass_fields__}
    unused = sorted(given - known - {"command", "task", "device"})
    if unused:
        flags = ", ".join("--" + name.replace("_", "-") for name in unused)
        raise ValueError(
            f"{flags} do not apply with --init: BERT fine-tuning takes its architecture and "
            "tokenizer from the checkpoint (see the --init options in --help)"
        )
    for cls in module.SECTIONS.values():
        overrides.update(collect_overrides(args, cls))
    out = Path(args.out or "runs/bert-classify")  # `train mlm` defaults to runs/mlm
    print(f"run directory: {out}", file=sys.stderr)
    results = module.train(out, overrides, args.config, resume=args.resume, device=args.device)
    summary = results["summary"]
    print(
        f"\nbest {summary['monitor']} {summary['best_metric']:.4f} at step {summary['best_step']} "
        f"({summary['stop_reason']}); {summary['wall_time_s'] / 60:.1f} min"
    )
    if "test" in results:
        test = results["test"]
        print(f"test accuracy {test['accuracy']:.4f}, macro-F1 {test['macro_f1']:.4f}")
    if "checkpoint" in results:
        print(f"Hugging Face checkpoint: {results['checkpoint']}")
    print(f"results in {out}/")
    return 0
