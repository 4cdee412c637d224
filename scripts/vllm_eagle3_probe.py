"""Compare vLLM's EAGLE-3 drafting with specviz's, tensor by tensor, on one prompt.

    .venv/bin/python scripts/vllm_eagle3_probe.py --export DIR [--prompt-index 0] [--num-hidden-layers N]

1. (vLLM's venv) `capture`: vLLM decodes one MT-bench prompt at T = 0 with DIR/eagle3 (from
   `python -m specviz.train.export_vllm --out DIR`), and hooks in its worker record the target's fused layer inputs,
   the head's fc output, each draft forward's input ids, positions and outputs, and the draft logits.
2. (ours) `compare`: specviz's target and Eagle3Head run the same first verify step (prefill) and the same chain of
   draft steps, and each tensor is compared with vLLM's: the largest difference and the draft tokens.

`--num-hidden-layers N` first rewrites a copy of DIR/eagle3 with `transformer_layer_config.num_hidden_layers = N`
(the shipped head's config says 32, LlamaConfig's default; vLLM builds that many layers).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MT_BENCH = ROOT.parent / "shared" / "data" / "mt_bench.jsonl"


# ---------------------------------------------------------------------------------------------- vLLM's side
def install_hooks(worker, path: str):
    """In vLLM's worker: record the target's aux hidden states and every draft forward into worker._probe."""
    runner = worker.model_runner
    worker._probe, worker._probe_path = [], path
    record = worker._probe

    def target_hook(module, args, kwargs, output):
        ids = kwargs["input_ids"]
        if isinstance(output, tuple) and len(record) < 64:
            record.append({"call": "target", "input_ids": ids.clone(),
                           "aux": [a.detach().clone() for a in output[1]]})

    draft = runner.drafter.model  # Eagle3LlamaForCausalLM

    def draft_hook(module, args, kwargs, output):
        record.append({"call": "draft", "input_ids": kwargs["input_ids"].clone(),
                       "positions": kwargs["positions"].clone(), "hidden_in": kwargs["hidden_states"].detach().clone(),
                       "normed": output[0].detach().clone(), "prenorm": output[1].detach().clone()})

    combine, logits = draft.combine_hidden_states, draft.compute_logits

    def combine_and_record(hidden):
        out = combine(hidden)
        record.append({"call": "fc", "input": hidden.detach().clone(), "output": out.detach().clone()})
        return out

    def logits_and_record(hidden):
        out = logits(hidden)
        record.append({"call": "logits", "hidden": hidden.detach().clone(), "logits": out.detach().clone()})
        return out

    wrap_forward(runner.model.model, target_hook)  # support_torch_compile's __call__ skips nn.Module hooks
    wrap_forward(draft.model, draft_hook)
    draft.combine_hidden_states, draft.compute_logits = combine_and_record, logits_and_record
    return len(draft.model.layers)


def wrap_forward(module, hook):
    """Call hook(module, args, kwargs, output) after each forward of this module (an instance attribute, which
    the class's __call__ reaches through self.forward)."""
    import inspect

    forward = module.forward
    signature = inspect.signature(forward)

    def recorded(*args, **kwargs):
        output = forward(*args, **kwargs)
        hook(module, (), dict(signature.bind(*args, **kwargs).arguments), output)  # every argument by name
        return output

    module.forward = recorded


def dump(worker):
    import torch

    torch.save(worker._probe, worker._probe_path)
    return len(worker._probe)


def capture(args) -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc sends the hook functions
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompt = json.loads(Path(args.prompt_file).read_text())
    llm = LLM(model=args.target, dtype="float32", enforce_eager=True, max_model_len=2048, seed=0,
              speculative_config={"method": "eagle3", "model": args.eagle3, "num_speculative_tokens": args.tokens})
    layers = llm.collective_rpc(install_hooks, args=(args.record,))[0]
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], SamplingParams(temperature=0.0, max_tokens=args.max_tokens),
                       use_tqdm=False)
    llm.collective_rpc(dump)
    Path(args.record + ".json").write_text(json.dumps({"output": list(out[0].outputs[0].token_ids), "layers": layers}))
    return 0


# ---------------------------------------------------------------------------------------------- ours
def compare(record_path: str, prompt: list[int], head_dir: str, target_dir: str) -> dict:
    """Our target and head on vLLM's first verify step and first chain of drafts; the differences."""
    import torch
    from transformers import AutoModelForCausalLM

    from specviz.models.eagle3 import Eagle3Head

    record = torch.load(record_path, weights_only=False)
    meta = json.loads(Path(record_path + ".json").read_text())
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    head = Eagle3Head.load(head_dir, target.config).float().eval()
    L = len(prompt)
    first = next(r for r in record if r["call"] == "target")
    fc = next(r for r in record if r["call"] == "fc")
    drafts = [r for r in record if r["call"] == "draft"][: 3]
    logits = [r for r in record if r["call"] == "logits"][: 3]
    report = {"vllm_draft_layers": meta["layers"], "vllm_output": meta["output"][:12]}
    with torch.inference_mode():
        ids = torch.tensor(prompt)[None]
        out = target(ids, output_hidden_states=True)
        features = torch.cat([out.hidden_states[n][0] for n in head.aux_layers], dim=-1)  # (L, 3H) layer inputs
        vllm_features = torch.cat(first["aux"], dim=-1)[:L]
        report["target_aux_max_abs"] = features.abs().max().item()  # the scale the differences below compare with
        report["target_aux_max_diff"] = (features - vllm_features).abs().max().item()
        report["fc_max_diff"] = (head.fc(features) - fc["output"][:L]).abs().max().item()
        bonus = int(out.logits[0, -1].argmax())
        d0 = drafts[0]
        ours_ids = torch.tensor(prompt[1:] + [bonus])
        report["first_draft_input_ids_equal"] = bool((d0["input_ids"][:L] == ours_ids).all())
        report["first_draft_positions"] = [d0["positions"][:L].min().item(), d0["positions"][:L].max().item()]
        lm_head = target.get_output_embeddings().weight
        embeds = target.get_input_embeddings()(ours_ids)[None]
        positions = torch.arange(L)[None]
        h, cache = head(features[None], embeds, positions)
        steps = []
        hidden, pos = h[0, -1:], L
        ref_prenorm = d0["prenorm"][:L]
        steps.append({"step": 1, "prenorm_max_diff": (h[0] - ref_prenorm).abs().max().item()})
        for i, lg in enumerate(logits):
            ours_logits = head.logits(hidden, lm_head)[0]
            theirs = lg["logits"][-1]
            theirs_draft = theirs[head.draft_ids()]
            steps[-1].update({"logits_max_diff": (ours_logits - theirs_draft).abs().max().item(),
                              "ours_token": int(head.draft_ids()[ours_logits.argmax()]),
                              "vllm_token": int(theirs.argmax())})
            if i + 1 >= len(drafts):
                break
            emb = target.get_input_embeddings()(torch.tensor([[steps[-1]["vllm_token"]]]))  # vLLM's draft fed back
            hidden_next, cache = head(hidden[None], emb, torch.tensor([[pos]]), cache)
            d = drafts[i + 1]
            steps.append({"step": i + 2, "vllm_position": d["positions"][:1].tolist(), "ours_position": pos,
                          "vllm_input_id": int(d["input_ids"][0]), "prenorm_max_diff":
                          (hidden_next[0, 0] - d["prenorm"][0]).abs().max().item()})
            hidden, pos = hidden_next[0], pos + 1
        report["draft_steps"] = steps
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode")
    c = sub.add_parser("capture", help="(vLLM's venv) decode and record; the default mode runs it")
    c.add_argument("--target", required=True)
    c.add_argument("--eagle3", required=True)
    c.add_argument("--prompt-file", required=True)
    c.add_argument("--record", required=True)
    c.add_argument("--tokens", type=int, default=3)
    c.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--export", help="a folder written by `python -m specviz.train.export_vllm --out`")
    parser.add_argument("--prompt-index", type=int, default=0)
    parser.add_argument("--num-hidden-layers", type=int, default=None)
    args = parser.parse_args(argv)
    if args.mode == "capture":
        return capture(args)
    if not args.export:
        parser.error("--export DIR is required")
    from transformers import AutoTokenizer

    from specviz.api import encode_prompt
    from specviz.bench.prompts import load_prompts

    export = Path(args.export).resolve()
    text = load_prompts(MT_BENCH)[args.prompt_index].text
    prompt = encode_prompt(AutoTokenizer.from_pretrained(str(export / "target")), text)
    with tempfile.TemporaryDirectory() as work:
        head = export / "eagle3"
        if args.num_hidden_layers is not None:
            head = Path(work) / "eagle3"
            shutil.copytree(export / "eagle3", head)
            config = json.loads((head / "config.json").read_text())
            config["transformer_layer_config"]["num_hidden_layers"] = args.num_hidden_layers
            (head / "config.json").write_text(json.dumps(config, indent=2))
        prompt_file, record = Path(work) / "prompt.json", str(Path(work) / "record.pt")
        prompt_file.write_text(json.dumps(prompt))
        subprocess.run([str(VLLM_PYTHON), __file__, "capture", "--target", str(export / "target"), "--eagle3", str(head),
                        "--prompt-file", str(prompt_file), "--record", record], check=True)
        report = compare(record, prompt, str(export / "eagle3"), str(export / "target"))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
