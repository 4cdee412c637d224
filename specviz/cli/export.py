"""`specviz export {vllm,llamacpp} --out DIR`: a target and its shipped drafters in the layout another engine loads
(specviz/train/export_vllm.py, specviz/llamacpp/export.py)."""
from __future__ import annotations

from specviz.arguments import DEFAULT_MODEL
from specviz.paths import ASSETS


def cmd_vllm(args) -> int:
    from specviz.train.export_vllm import export_all

    for name, folder in export_all(args.out, args.model, args.assets, args.tokens).items():
        print(f"{name}: {folder}")
    return 0


def cmd_llamacpp(args) -> int:
    from specviz.llamacpp.export import export_all, server_commands

    files = export_all(args.out, args.model, args.assets, args.dtype)
    for name, path in files.items():
        print(f"{name}: {path}")
    for command in server_commands(files):
        print(command)
    return 0


def register(sub) -> None:
    p = sub.add_parser("export", help="write a target and its shipped drafters in the layout vLLM or llama.cpp loads")
    targets = p.add_subparsers(dest="engine", required=True)
    for engine, run, help_text in (
            ("vllm", cmd_vllm, "target/, draft/ and eagle3/ folders for vLLM (docs/vllm.md)"),
            ("llamacpp", cmd_llamacpp, "target.gguf, eagle3.gguf and draft.gguf for an unmodified llama-server")):
        t = targets.add_parser(engine, help=help_text)
        t.add_argument("--out", required=True, help="the folder to write into")
        t.add_argument("--model", default=DEFAULT_MODEL,
                       help="the target: a preset" + (" or a model key" if engine == "vllm" else " (its GGUF)"))
        t.add_argument("--assets", default=str(ASSETS), help="where the shipped drafters lie (draft-MODEL, eagle3-MODEL)")
        if engine == "vllm":
            t.add_argument("--tokens", type=int, default=3, help="the EAGLE-3 head's speculative tokens per step")
        else:
            t.add_argument("--dtype", choices=("f32", "f16"), default="f32",
                           help="the drafters' weights: f32 holds them exactly (the default), f16 halves the files")
        t.set_defaults(run=run)
